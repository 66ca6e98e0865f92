"""A session's brokered secrets on the gateway's side: what they are, checked whole, and the values.

The sandbox holds placeholders; the session's proxy puts the values into requests to the hosts each
secret is bound to. The gateway validates a declaration or a change as a whole
(:func:`plan_create`, :func:`plan_update`: pure, raising :class:`InvalidRequest` with the field to
blame) into a :class:`SecretSet`, which the egress manager sends to the proxy whole (control op
``secrets``) before the :class:`SecretVault` takes it as the session's.

Values live in memory only (the vault, and the proxy's). The session record keeps each secret's
:class:`SecretRecord` (its placeholder and bindings, never its value): after a gateway restart the
placeholders still answer and the watchdog knows what the proxy should hold, but the values are gone
from the gateway: a change sends those secrets without a value and the proxy keeps the ones it holds
(the proxy's status carries a digest of each value, keyed with the gateway's control token, so the
gateway can tell which value the proxy holds without seeing it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, SecretStr

from corral.contracts import control
from corral.contracts.control import PutSecrets, SecretEntry, SecretsState
from corral.contracts.placeholders import DEFAULT_LOCATIONS, MAX_SECRETS, Location, new_placeholder, value_digest
from corral.errors import InvalidRequest
from corral.gateway.models import SecretSpec, SecretUpdate
from corral.proxy.policy import WEB_PORTS, Rule, parse_rule

# Room left on the proxy's control line for the op's actor ("api-key:owner", "gateway:reassert").
ACTOR_ROOM = 512


def covers(allow_rules: Iterable[Rule], binding: Rule) -> bool:
    """Whether one of ``allow_rules`` allows everything ``binding`` does: the same host or a
    subdomain of a wildcard, the same port (a rule without one: the web ports), the same methods or
    fewer, the same path prefix or a longer one."""
    return any(_covers(rule, binding) for rule in allow_rules)


def _covers(rule: Rule, binding: Rule) -> bool:
    if rule.wildcard:
        host_ok = binding.host.endswith("." + rule.host) or (binding.wildcard and binding.host == rule.host)
    else:
        host_ok = not binding.wildcard and binding.host == rule.host
    # A rule without a port allows the web ports, so a binding without one is within it alone.
    port_ok = binding.port == rule.port or (rule.port is None and binding.port in WEB_PORTS)
    methods_ok = rule.methods is None or (binding.methods is not None and binding.methods <= rule.methods)
    path_ok = rule.path_prefix is None or (
        binding.path_prefix is not None and binding.path_prefix.startswith(rule.path_prefix)
    )
    return host_ok and port_ok and methods_ok and path_ok


class SecretRecord(BaseModel):
    """One secret as the session record keeps it: its placeholder and bindings, never its value."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    placeholder: str
    allow: tuple[str, ...]
    locations: tuple[Location, ...]


@dataclass(frozen=True, slots=True)
class SecretSet:
    """A session's whole set of secrets: records (what may be kept) and the values the gateway holds
    (all of them, or none after a gateway restart)."""

    records: Mapping[str, SecretRecord] = field(default_factory=dict)
    values: Mapping[str, SecretStr] = field(default_factory=dict)

    def __repr__(self) -> str:  # the dataclass's would list the values' (starred) reprs; names suffice
        return f"SecretSet({sorted(self.records)})"

    @property
    def names(self) -> list[str]:
        return sorted(self.records)

    def placeholders(self) -> dict[str, str]:
        return {name: record.placeholder for name, record in sorted(self.records.items())}

    def missing_values(self) -> list[str]:
        """The secrets whose value this gateway does not hold (it restarted since they were set)."""
        return [name for name in self.names if name not in self.values]

    def message(self, actor: str) -> PutSecrets:
        """The control message that sets exactly this set on the proxy (the only place values are
        written). A secret whose value this gateway does not hold goes without one: the proxy keeps
        the value it holds (none, if it restarted too)."""
        entries = tuple(
            SecretEntry(
                name,
                record.placeholder,
                self.values[name].get_secret_value() if name in self.values else None,
                record.allow,
                record.locations,
            )
            for name, record in sorted(self.records.items())
        )
        return PutSecrets(entries, actor)

    def held_by(self, status: SecretsState, key: str) -> bool:
        """Whether a proxy whose secrets status is ``status`` holds this set: the same names and,
        for each value this gateway holds, the same value (its digest keyed with ``key``, the
        gateway's control token). A proxy that reports no digests (an older image) is judged by its
        names alone."""
        if sorted(status.names) != self.names:
            return False
        digests = status.digests
        if digests is None:
            return True
        return all(
            digests.get(name) == value_digest(key, value.get_secret_value().encode())
            for name, value in self.values.items()
        )


def _check_covered(name: str, bindings: Iterable[str], allow: Iterable[str], field: str) -> None:
    rules = [parse_rule(entry) for entry in allow]
    for binding in bindings:
        if not covers(rules, parse_rule(binding)):
            raise InvalidRequest(
                f"secret {name}: {binding!r} is not within the session's allowlist ({', '.join(allow) or 'empty'})",
                field=field,
            )


def plan_create(specs: Mapping[str, SecretSpec], allow: list[str], hermetic: bool) -> SecretSet:
    """A new session's secrets, each with a fresh placeholder; raises InvalidRequest naming the field."""
    if not specs:
        return SecretSet()
    if hermetic:
        raise InvalidRequest("a hermetic replay has no route out: it takes no secrets", field="secrets")
    records: dict[str, SecretRecord] = {}
    for name, spec in specs.items():
        _check_covered(name, spec.allow, allow, f"secrets.{name}.allow")
        records[name] = SecretRecord(placeholder=new_placeholder(), allow=tuple(spec.allow), locations=tuple(spec.in_))
    return _fitting(SecretSet(records, {name: spec.value for name, spec in specs.items()}))


def _fitting(secret_set: SecretSet) -> SecretSet:
    """``secret_set``, when its control op fits on one of the proxy's lines; raises InvalidRequest
    otherwise (a valid declaration can be too large once its values and long bindings add up)."""
    size = len(control.encode(secret_set.message(""))) + ACTOR_ROOM
    if size > control.MAX_LINE_BYTES:
        raise InvalidRequest(
            f"these secrets take {size} bytes to send to the egress proxy; at most {control.MAX_LINE_BYTES}",
            field="secrets",
        )
    return secret_set


def plan_update(
    current: SecretSet, changes: Mapping[str, SecretUpdate | None] | None, allow: list[str], hermetic: bool
) -> SecretSet:
    """The set after a PATCH (``changes``: name -> new or changed secret, or None to revoke; ``allow``:
    the session's allowlist after the PATCH), checked whole; raises InvalidRequest naming the field.

    Every secret of the result must still be covered by ``allow`` (a narrowed allowlist that would
    leave a binding outside is refused). Values are needed only for new secrets: after a gateway
    restart the ones it no longer holds go to the proxy without a value, and the proxy keeps its own.
    """
    changes = changes or {}
    if changes and hermetic:
        raise InvalidRequest("a hermetic replay has no route out: it takes no secrets", field="secrets")
    records, values = dict(current.records), dict(current.values)
    for name, change in changes.items():
        old = records.get(name)
        if change is None or (old is None and change.allow is None):
            if old is None:
                raise InvalidRequest(f"no secret {name} in this session", field=f"secrets.{name}")
            del records[name]
            values.pop(name, None)
            continue
        if old is None and change.value is None:
            raise InvalidRequest(f"secret {name} is new: give its value", field=f"secrets.{name}.value")
        base = old or SecretRecord(placeholder=new_placeholder(), allow=(), locations=DEFAULT_LOCATIONS)
        records[name] = SecretRecord(
            placeholder=base.placeholder,  # never changes for a name
            allow=base.allow if change.allow is None else tuple(change.allow),
            locations=base.locations if change.in_ is None else tuple(change.in_),
        )
        if change.value is not None:
            values[name] = change.value
    if len(records) > MAX_SECRETS:
        raise InvalidRequest(f"a session holds at most {MAX_SECRETS} secrets", field="secrets")
    for name, record in sorted(records.items()):
        blame = f"secrets.{name}.allow" if name in changes else "allow"
        _check_covered(name, record.allow, allow, blame)
    return _fitting(SecretSet(records, values))


class SecretVault:
    """Every live session's secret set: the values in this process's memory only."""

    def __init__(self) -> None:
        self._sets: dict[str, SecretSet] = {}
        self._pending: dict[str, SecretSet] = {}  # a set sent whose outcome is unknown (answer and status lost)
        self._warned: set[str] = set()  # sessions whose lost values the watchdog already reported

    def get(self, session_id: str) -> SecretSet:
        return self._sets.get(session_id, SecretSet())

    def held(self) -> set[str]:
        """The sessions whose secret set it holds (none: no value left in this process)."""
        return set(self._sets)

    def keep(self, session_id: str, secret_set: SecretSet) -> None:
        """``secret_set`` is now the session's (the proxy took it)."""
        self._pending.pop(session_id, None)
        if secret_set.records:
            self._sets[session_id] = secret_set
        else:
            self._sets.pop(session_id, None)
        self._warned.discard(session_id)

    def adopt(self, session_id: str, records: Mapping[str, SecretRecord]) -> None:
        """A session a restarted gateway adopted: its secrets' records, without values."""
        if records:
            self._sets[session_id] = SecretSet(dict(records))

    def send_failed(self, session_id: str, secret_set: SecretSet) -> None:
        """``secret_set`` was sent and neither the proxy's answer nor its status came back: the
        proxy may hold it (the watchdog looks, and takes it if so)."""
        self._pending[session_id] = secret_set

    def pending(self, session_id: str) -> SecretSet | None:
        return self._pending.get(session_id)

    def forget(self, session_id: str) -> None:
        self._pending.pop(session_id, None)
        self._sets.pop(session_id, None)
        self._warned.discard(session_id)

    def first_warning(self, session_id: str) -> bool:
        """True the first time it is asked for ``session_id`` (since its set last changed)."""
        if session_id in self._warned:
            return False
        self._warned.add(session_id)
        return True
