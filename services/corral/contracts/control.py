"""The egress proxy's control channel, as both ends speak it: JSON Lines over TCP, one typed message a
line, one typed answer to each message that wants one.

The gateway builds these messages and reads :class:`Reply`; the proxy parses them
(:func:`parse_message`) and answers with :class:`Reply` or :class:`Refusal`; the sandbox's controller
reports actions and the control lease. Standard library only, so the egress image (no pydantic)
carries it whole. Parsing is pure: what is wrong is raised as ``invalid(code, message, field)``,
which each side passes (the proxy :class:`corral.errors.InvalidMessage`), so the one exception tree
stays in ``corral.errors``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import ClassVar, Final, Literal

from corral.contracts.placeholders import (
    DEFAULT_LOCATIONS,
    LOCATIONS,
    MAX_BINDINGS,
    MAX_SECRETS,
    PLACEHOLDER,
    name_problem,
    value_problem,
)

CONTROL_PORT: Final = 8081
# A secrets message holds up to MAX_SECRETS values of up to 4 KiB each, JSON-escaped.
MAX_LINE_BYTES: Final = 1024 * 1024
MODES: Final = ("enforce", "report")
Role = Literal["gateway", "controller"]
Phase = Literal["start", "end"]
# Action ids land in every audit record, the HAR and the CLI's tables: a short token, no spaces, no
# newlines or other control characters (the controller's are ``a<n>.<boot>``).
# The user name a command's proxy URL carries, its action id the password (corral.sandbox.agent.agentenv
# writes it, corral.proxy.attribution reads it).
PROXY_USER: Final = "corral-action"
ACTION_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
LEASE_CHANGES: Final = ("taken", "returned", "left", "requested", "request_ended")
LINK_CHANGES: Final = ("created", "used", "revoked", "expired")
LINK_MODES: Final = ("view", "control")
VOLUME_CHANGES: Final = ("claimed", "released")
# A browser profile loaded into a session, saved from it, or a load or save that failed (corral.gateway.profiles).
PROFILE_CHANGES: Final = ("loaded", "saved", "failed")
MAX_PROFILE_BYTES: Final = 1 << 40
# A port preview made, revoked or expired (by its owner), a client connection through it opened or
# closed (with the client's address, and the bytes each way once closed): corral.gateway.previews.
PREVIEW_CHANGES: Final = ("created", "revoked", "expired", "opened", "closed")
PreviewChange = Literal["created", "revoked", "expired", "opened", "closed"]
MAX_PREVIEW_BYTES: Final = 1 << 50
# A download begun, ended (completed, canceled, capped by Corral, interrupted) in the sandbox's browser
# (the controller's report), or fetched through the gateway (the gateway's): corral.contracts.downloads.
DOWNLOAD_CHANGES: Final = ("started", "completed", "canceled", "capped", "interrupted", "fetched")
MAX_DOWNLOAD_BYTES: Final = 1 << 50
# The proxy's state files the gateway mirrors where it shares no directory with the proxy (ReadState):
# named, never a path; a read answers at most MAX_READ_BYTES (base64 in one line under MAX_LINE_BYTES).
STATE_FILES: Final = ("audit", "responses")
StateFile = Literal["audit", "responses"]
MAX_READ_BYTES: Final = 256 * 1024
MAX_STATE_OFFSET: Final = 1 << 50
MAX_MARKS: Final = 64  # marks of the audit chain a read's answer carries at most
SESSION_CHANGES: Final = ("pause", "resume")  # a session's own changes the gateway reports (SessionEvent)
MAX_SAVED_ENTRIES: Final = 8
# corral.errors.ErrorCode's values for a refused line (this module may not import corral.errors).
INVALID_JSON: Final = "invalid_json"
INVALID_REQUEST: Final = "invalid_request"
INVALID_FIELD: Final = "invalid_field"
MESSAGE_TOO_LARGE: Final = "message_too_large"

# A JSON object as json.loads gives it and json.dumps takes it: only at the line's edge; every
# message and answer is one of the typed classes below.
JsonObject = dict[str, object]
# How a parser says what is wrong: (code, message, field) -> the exception to raise.
Invalid = Callable[[str, str, "str | None"], Exception]


# -- messages ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """A connection's first line: the token says who speaks (the gateway or the controller)."""

    OP: ClassVar = "hello"
    token: str = field(repr=False)

    def to_json(self) -> JsonObject:
        return {"op": self.OP, "token": self.token}


@dataclass(frozen=True, slots=True)
class SetPolicy:
    """The gateway's whole live policy: the allowlist and the mode."""

    OP: ClassVar = "policy"
    allow: tuple[str, ...]
    mode: str
    actor: str = "gateway"

    def to_json(self) -> JsonObject:
        return {"op": self.OP, "allow": list(self.allow), "mode": self.mode, "actor": self.actor}


@dataclass(frozen=True, slots=True)
class Status:
    """The gateway asks for the proxy's state (policy, chain head, secrets, replay)."""

    OP: ClassVar = "status"

    def to_json(self) -> JsonObject:
        return {"op": self.OP}


@dataclass(frozen=True, slots=True)
class ActionEvent:
    """The controller's report of an agent action's start or end."""

    OP: ClassVar = "action"
    id: str
    phase: Phase
    ack: bool = False
    # Who acted, when not the agent: ``human:<link id>`` (a viewer's input), ``cdp:<conn id>``.
    actor: str | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"op": self.OP, "id": self.id, "phase": self.phase}
        if self.actor is not None:
            out["actor"] = self.actor
        if self.ack:
            out["ack"] = True
        return out


@dataclass(frozen=True, slots=True)
class LeaseEvent:
    """The controller's report of a change of the session's control lease (corral.sandbox.control.lease)."""

    OP: ClassVar = "lease"
    change: str  # one of LEASE_CHANGES
    holder: str
    previous: str

    def to_json(self) -> JsonObject:
        return {"op": self.OP, "change": self.change, "holder": self.holder, "previous": self.previous}


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """The gateway's report of a viewer link made, used, revoked or expired (corral.gateway.links)."""

    OP: ClassVar = "link"
    change: str  # one of LINK_CHANGES
    link: str
    mode: str  # one of LINK_MODES
    actor: str
    expires_at: float

    def to_json(self) -> JsonObject:
        return {
            "op": self.OP,
            "change": self.change,
            "link": self.link,
            "mode": self.mode,
            "actor": self.actor,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True, slots=True)
class PreviewEvent:
    """The gateway's report of a port preview's change or of a connection through it (corral.gateway.previews)."""

    OP: ClassVar = "preview"
    change: str  # one of PREVIEW_CHANGES
    preview: str
    port: int
    actor: str
    expires_at: float
    remote: str = ""  # the client's address (host:port) of an opened or closed connection
    bytes_in: int = 0  # a closed connection's bytes from the client
    bytes_out: int = 0  # and to it

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "op": self.OP,
            "change": self.change,
            "preview": self.preview,
            "port": self.port,
            "actor": self.actor,
            "expires_at": self.expires_at,
        }
        if self.remote:
            out["remote"] = self.remote
        if self.change == "closed":
            out["bytes_in"], out["bytes_out"] = self.bytes_in, self.bytes_out
        return out


@dataclass(frozen=True, slots=True)
class DownloadEvent:
    """A download's change: ``started`` and how it ended, reported by the controller (``action``: the
    native action or CDP window that caused it, ``actor`` who), ``fetched`` by the gateway (``actor``:
    the caller's key or token id, ``bytes`` sent). Its name and URL only as far as the audit's caps."""

    OP: ClassVar = "download"
    change: str  # one of DOWNLOAD_CHANGES
    download: str
    name: str
    url: str
    size: int
    actor: str
    action: str | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "op": self.OP,
            "change": self.change,
            "download": self.download,
            "name": self.name,
            "url": self.url,
            "bytes": self.size,
            "actor": self.actor,
        }
        if self.action is not None:
            out["action"] = self.action
        return out


@dataclass(frozen=True, slots=True)
class LifetimeEvent:
    """The gateway's report of a session's expiry changed by its owner (``PATCH timeout_s``)."""

    OP: ClassVar = "lifetime"
    actor: str
    expires_at: float
    previous_expires_at: float

    def to_json(self) -> JsonObject:
        return {
            "op": self.OP,
            "actor": self.actor,
            "expires_at": self.expires_at,
            "previous_expires_at": self.previous_expires_at,
        }


@dataclass(frozen=True, slots=True)
class VolumeEvent:
    """The gateway's report of the session's workspace volume claimed or released
    (corral.gateway.volumes): its name and sizes, never what it holds."""

    OP: ClassVar = "volume"
    change: str  # one of VOLUME_CHANGES
    volume: str
    size_mb: int
    used_bytes: int

    def to_json(self) -> JsonObject:
        return {
            "op": self.OP,
            "change": self.change,
            "volume": self.volume,
            "size_mb": self.size_mb,
            "used_bytes": self.used_bytes,
        }


@dataclass(frozen=True, slots=True)
class ProfileEvent:
    """The gateway's report of a browser profile loaded into the session or saved from it (its name
    and size, never its contents); ``failed``: a load or save that did not happen."""

    OP: ClassVar = "profile"
    change: str  # one of PROFILE_CHANGES
    profile: str
    size: int  # the archive's bytes (its record's ``bytes``)
    actor: str

    def to_json(self) -> JsonObject:
        return {"op": self.OP, "change": self.change, "profile": self.profile, "bytes": self.size, "actor": self.actor}


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """The gateway's report of a session paused or resumed (corral.gateway.sessions.pausing): what
    was saved, by directory, in bytes, and how many tabs; never contents."""

    OP: ClassVar = "session"
    change: str  # one of SESSION_CHANGES
    actor: str
    saved: tuple[tuple[str, int], ...] = ()  # (directory, bytes)
    tabs: int = 0

    def to_json(self) -> JsonObject:
        return {
            "op": self.OP,
            "change": self.change,
            "actor": self.actor,
            "saved": {path: size for path, size in self.saved},
            "tabs": self.tabs,
        }


@dataclass(frozen=True, slots=True)
class SecretEntry:
    """One brokered secret on the wire; ``value`` None: the proxy keeps the value it holds."""

    name: str
    placeholder: str
    value: str | None = field(repr=False)  # never in a repr or a log line
    allow: tuple[str, ...]
    locations: tuple[str, ...] = DEFAULT_LOCATIONS

    def to_json(self) -> JsonObject:
        out: JsonObject = {"name": self.name, "placeholder": self.placeholder}
        if self.value is not None:
            out["value"] = self.value
        return {**out, "allow": list(self.allow), "in": list(self.locations)}


@dataclass(frozen=True, slots=True)
class PutSecrets:
    """The session's whole live set of brokered secrets (names missing from it are revoked)."""

    OP: ClassVar = "secrets"
    secrets: tuple[SecretEntry, ...]
    actor: str = "gateway"

    def to_json(self) -> JsonObject:
        return {"op": self.OP, "actor": self.actor, "secrets": [entry.to_json() for entry in self.secrets]}


@dataclass(frozen=True, slots=True)
class ReadState:
    """The gateway reads one of the proxy's state files (STATE_FILES) from ``offset``, at most
    ``limit`` bytes (the gateway role only): its mirror, where it shares no directory with the proxy.
    ``after``: the seq of the gateway's copy, whose chain's marks past it the answer carries."""

    OP: ClassVar = "read"
    file: StateFile
    offset: int
    limit: int = MAX_READ_BYTES
    after: int = 0

    def to_json(self) -> JsonObject:
        out: JsonObject = {"op": self.OP, "file": self.file, "offset": self.offset, "limit": self.limit}
        if self.after:
            out["after"] = self.after
        return out


# The gateway's own events about a session, reported into its audit chain.
# DownloadEvent: the controller's too (a download's life), the gateway's a fetch.
GatewayEvent = LinkEvent | LifetimeEvent | VolumeEvent | ProfileEvent | SessionEvent | PreviewEvent | DownloadEvent
Message = Hello | SetPolicy | Status | ActionEvent | LeaseEvent | PutSecrets | ReadState | GatewayEvent


# -- answers ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Head:
    """The audit chain's head: ``seq`` and ``hash`` of its last record (what the gateway anchors)."""

    seq: int
    hash: str

    def to_json(self) -> JsonObject:
        return {"seq": self.seq, "hash": self.hash}

    @classmethod
    def parse(cls, obj: object) -> Head | None:
        """None for anything else: a proxy too old to report one."""
        if not isinstance(obj, dict):
            return None
        seq, chain_hash = obj.get("seq"), obj.get("hash")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(chain_hash, str):
            return None
        return cls(seq, chain_hash)


@dataclass(frozen=True, slots=True)
class SecretsState:
    """The secrets a proxy holds: names, whether their values are loaded, each value's keyed digest
    (None from a proxy too old to give digests)."""

    generation: int = 0
    names: tuple[str, ...] = ()
    loaded: bool | None = None
    digests: Mapping[str, str] | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"generation": self.generation, "names": list(self.names), "loaded": self.loaded}
        if self.digests is not None:
            out["digests"] = dict(self.digests)
        return out

    @classmethod
    def parse(cls, obj: object) -> SecretsState | None:
        """None for anything but an object: a proxy from before secrets."""
        if not isinstance(obj, dict):
            return None
        generation, loaded, digests = obj.get("generation"), obj.get("loaded"), obj.get("digests")
        return cls(
            generation if isinstance(generation, int) else 0,
            tuple(sorted(str(name) for name in _items(obj.get("names")))),
            loaded if isinstance(loaded, bool) else None,
            {str(k): str(v) for k, v in digests.items()} if isinstance(digests, dict) else None,
        )


@dataclass(frozen=True, slots=True)
class ReplayState:
    """A hermetic proxy's recorded responses: how many it loaded, or why none."""

    flows: int = 0
    error: str | None = None

    def to_json(self) -> JsonObject:
        return {"flows": self.flows, "error": self.error}

    @classmethod
    def parse(cls, obj: object) -> ReplayState | None:
        if not isinstance(obj, dict):
            return None
        flows, error = obj.get("flows"), obj.get("error")
        return cls(flows if isinstance(flows, int) else 0, str(error) if error else None)


@dataclass(frozen=True, slots=True)
class FileChunk:
    """A :class:`ReadState`'s answer: ``data`` read at ``offset`` of the file, whose ``size`` was
    this when it was read (``data`` empty at its end). ``data`` is base64 on the wire."""

    file: str
    offset: int
    data: bytes = field(repr=False)
    size: int

    def to_json(self) -> JsonObject:
        encoded = base64.b64encode(self.data).decode()
        return {"file": self.file, "offset": self.offset, "data": encoded, "size": self.size}

    @classmethod
    def parse(cls, obj: object, invalid: Invalid) -> FileChunk | None:
        """None when there is none; ``invalid`` for one that is not whole or not within its file."""
        if obj is None:
            return None
        if not isinstance(obj, dict) or obj.get("file") not in STATE_FILES or not isinstance(obj.get("data"), str):
            raise invalid(INVALID_FIELD, "'chunk' must name a state file and carry its data", "chunk")
        offset, size = obj.get("offset"), obj.get("size")
        if not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_STATE_OFFSET for n in (offset, size)
        ):
            raise invalid(INVALID_FIELD, "'chunk' needs a whole offset and size", "chunk")
        if len(obj["data"]) > 4 * (MAX_READ_BYTES // 3 + 1):
            raise invalid(INVALID_FIELD, f"'chunk' carries more than {MAX_READ_BYTES} bytes", "chunk.data")
        try:
            data = base64.b64decode(obj["data"], validate=True)
        except (binascii.Error, ValueError):
            raise invalid(INVALID_FIELD, "'chunk.data' is not base64", "chunk.data") from None
        assert isinstance(offset, int) and isinstance(size, int)  # checked above; for mypy
        if offset + len(data) > size:
            raise invalid(INVALID_FIELD, "'chunk' ends past its file's size", "chunk")
        return cls(str(obj["file"]), offset, data, size)


@dataclass(frozen=True, slots=True)
class Reply:
    """An accepted message's answer (``ok``); each field present only where the message gives it: a
    hello's ``role``; the policy (``allow``, ``mode``, ``generation``) and the chain ``head`` after a
    policy change or a status; the ``secrets`` after a secrets change or a status; the rest a status's."""

    role: str | None = None
    session: str | None = None
    allow: tuple[str, ...] | None = None
    mode: str | None = None
    generation: int | None = None
    head: Head | None = None
    records: int | None = None
    actions: tuple[str, ...] | None = None
    hermetic: bool | None = None
    replay: ReplayState | None = None
    responses: Mapping[str, int] | None = None
    secrets: SecretsState | None = None
    chunk: FileChunk | None = None  # a ReadState's
    marks: tuple[Head, ...] | None = None  # a ReadState's of the audit: the chain's marks past its ``after``

    def to_json(self) -> JsonObject:
        out: JsonObject = {"ok": True}
        for name in (item.name for item in fields(self)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, Head | SecretsState | ReplayState | FileChunk):
                value = value.to_json()
            elif isinstance(value, tuple):
                value = [item.to_json() if isinstance(item, Head) else item for item in value]
            elif isinstance(value, Mapping):
                value = dict(value)
            out[name] = value
        return out

    @classmethod
    def parse(cls, obj: JsonObject, invalid: Invalid) -> Reply:
        """An ``ok`` answer as the gateway reads it: what an older proxy leaves out is None; a field
        of the wrong kind is ``invalid``."""
        allow = obj.get("allow")
        if allow is not None and not _strings(allow):
            raise invalid(INVALID_FIELD, "'allow' must be a list of strings", "allow")
        generation = obj.get("generation")
        if generation is not None and (not isinstance(generation, int) or isinstance(generation, bool)):
            raise invalid(INVALID_FIELD, "'generation' must be an integer", "generation")
        mode, role, session = obj.get("mode"), obj.get("role"), obj.get("session")
        records, hermetic = obj.get("records"), obj.get("hermetic")
        return cls(
            role=str(role) if role is not None else None,
            session=str(session) if session is not None else None,
            allow=tuple(_items(allow)) if allow is not None else None,
            mode=str(mode) if mode is not None else None,
            generation=generation,
            head=Head.parse(obj.get("head")),
            records=records if isinstance(records, int) else None,
            actions=tuple(str(a) for a in _items(obj.get("actions"))) if "actions" in obj else None,
            hermetic=hermetic if isinstance(hermetic, bool) else None,
            replay=ReplayState.parse(obj.get("replay")),
            responses=_counts(obj.get("responses")),
            secrets=SecretsState.parse(obj.get("secrets")),
            chunk=FileChunk.parse(obj.get("chunk"), invalid),
            marks=_marks(obj.get("marks"), invalid),
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused message's answer: ``code`` is one of corral.errors.ErrorCode's values (none for a
    hello whose token is unknown), ``field`` the one to blame."""

    error: str
    code: str | None = None
    field: str | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"ok": False}
        if self.code is not None:
            out["code"] = self.code
        out["error"] = self.error
        if self.field is not None:
            out["field"] = self.field
        return out


Answer = Reply | Refusal


def encode(item: Message | Answer | Mapping[str, object]) -> bytes:
    """One line of the channel (a raw object: the controller's reports in corral.sandbox.egress, and
    tests' stand-in peers). Not ASCII-escaped: a non-ASCII value takes its UTF-8 bytes (2-3), not a
    \\uXXXX escape (6 or 12); each side reads a line as UTF-8 JSON."""
    obj = dict(item) if isinstance(item, Mapping) else item.to_json()
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# -- parsing ----------------------------------------------------------------------------------------


def parse_object(line: bytes, invalid: Invalid) -> JsonObject:
    """A line's JSON object; ``invalid`` for a line too long, not JSON, or not an object."""
    if len(line) > MAX_LINE_BYTES:
        raise invalid(MESSAGE_TOO_LARGE, f"message longer than {MAX_LINE_BYTES} bytes", None)
    try:
        obj = json.loads(line)
    except ValueError:
        raise invalid(INVALID_JSON, "message is not JSON", None) from None
    if not isinstance(obj, dict):
        raise invalid(INVALID_JSON, "message must be a JSON object", None)
    return obj


def parse_message(line: bytes, invalid: Invalid) -> Message:
    """One line of the channel as the proxy reads it; ``invalid`` names what is wrong."""
    fields = _Fields(parse_object(line, invalid), invalid)
    parser = _PARSERS.get(str(fields.obj.get("op")))
    if parser is None:
        raise invalid(INVALID_REQUEST, f"unknown op {fields.obj.get('op')!r}", "op")
    return parser(fields)


@dataclass(frozen=True, slots=True)
class _Fields:
    """A message's fields, each read with its check; ``invalid`` raises the first that fails."""

    obj: JsonObject
    invalid: Invalid

    def text(self, key: str, max_len: int = 256) -> str:
        value = self.obj.get(key)
        if not isinstance(value, str) or not value or len(value) > max_len:
            message = f"{key!r} must be a non-empty string of at most {max_len} characters"
            raise self.invalid(INVALID_FIELD, message, key)
        return value

    def token(self, key: str) -> str:
        """An id that lands in audit records: an action id's alphabet and length."""
        value = self.obj.get(key)
        # fullmatch, not match: "$" would let a trailing newline through.
        if not isinstance(value, str) or ACTION_ID.fullmatch(value) is None:
            message = f"{key!r} must be 1 to 64 characters from A-Z a-z 0-9 _ . : -"
            raise self.invalid(INVALID_FIELD, message, key)
        return value

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.obj.get(key)
        if value not in choices:
            raise self.invalid(INVALID_FIELD, f"{key!r} must be one of {', '.join(choices)}", key)
        return str(value)

    def actor(self) -> str:
        return self.text("actor") if "actor" in self.obj else "gateway"


def _policy(f: _Fields) -> SetPolicy:
    allow = f.obj.get("allow")
    if not _strings(allow):
        raise f.invalid(INVALID_FIELD, "'allow' must be a list of strings", "allow")
    mode = f.obj.get("mode", "enforce")
    if mode not in MODES:
        raise f.invalid(INVALID_FIELD, f"'mode' must be one of {', '.join(MODES)}", "mode")
    return SetPolicy(tuple(_items(allow)), str(mode), f.actor())


def _action(f: _Fields) -> ActionEvent:
    phase = f.obj.get("phase")
    if phase != "start" and phase != "end":
        raise f.invalid(INVALID_FIELD, "'phase' must be 'start' or 'end'", "phase")
    actor = f.token("actor") if f.obj.get("actor") is not None else None
    return ActionEvent(f.token("id"), phase, bool(f.obj.get("ack", False)), actor)


def _link(f: _Fields) -> LinkEvent:
    expires_at = f.obj.get("expires_at")
    if isinstance(expires_at, bool) or not isinstance(expires_at, int | float):
        raise f.invalid(INVALID_FIELD, "'expires_at' must be a number (unix seconds)", "expires_at")
    change, link = f.choice("change", LINK_CHANGES), f.token("link")
    return LinkEvent(change, link, f.choice("mode", LINK_MODES), f.token("actor"), float(expires_at))


def _count(f: _Fields, key: str, top: int) -> int:
    value = f.obj.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise f.invalid(INVALID_FIELD, f"{key!r} must be a whole number from 0 to {top}", key)
    return value


def _preview(f: _Fields) -> PreviewEvent:
    remote = f.obj.get("remote", "")
    if not isinstance(remote, str) or len(remote) > 64 or not remote.isprintable() or " " in remote:
        raise f.invalid(INVALID_FIELD, "'remote' must be an address of at most 64 characters", "remote")
    return PreviewEvent(
        f.choice("change", PREVIEW_CHANGES),
        f.token("preview"),
        _count(f, "port", 65535),
        f.token("actor"),
        _unix_time(f, "expires_at"),
        remote,
        _count(f, "bytes_in", MAX_PREVIEW_BYTES),
        _count(f, "bytes_out", MAX_PREVIEW_BYTES),
    )


def _download(f: _Fields) -> DownloadEvent:
    url = f.obj.get("url", "")
    if not isinstance(url, str) or len(url) > 4096:
        raise f.invalid(INVALID_FIELD, "'url' must be a string of at most 4096 characters", "url")
    action = f.token("action") if f.obj.get("action") is not None else None
    return DownloadEvent(
        f.choice("change", DOWNLOAD_CHANGES),
        f.token("download"),
        f.text("name", 256),
        url,
        _count(f, "bytes", MAX_DOWNLOAD_BYTES),
        f.token("actor"),
        action,
    )


def _unix_time(f: _Fields, name: str) -> float:
    value = f.obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise f.invalid(INVALID_FIELD, f"'{name}' must be a number (unix seconds)", name)
    return float(value)


def _lifetime(f: _Fields) -> LifetimeEvent:
    return LifetimeEvent(f.token("actor"), _unix_time(f, "expires_at"), _unix_time(f, "previous_expires_at"))


def _volume(f: _Fields) -> VolumeEvent:
    sizes = []
    for key in ("size_mb", "used_bytes"):
        value = f.obj.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise f.invalid(INVALID_FIELD, f"{key!r} must be a whole number, 0 or more", key)
        sizes.append(value)
    return VolumeEvent(f.choice("change", VOLUME_CHANGES), f.token("volume"), sizes[0], sizes[1])


def _profile(f: _Fields) -> ProfileEvent:
    size = f.obj.get("bytes")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_PROFILE_BYTES:
        raise f.invalid(INVALID_FIELD, "'bytes' must be a non-negative integer", "bytes")
    return ProfileEvent(f.choice("change", PROFILE_CHANGES), f.token("profile"), size, f.token("actor"))


def _session(f: _Fields) -> SessionEvent:
    saved, tabs = f.obj.get("saved", {}), f.obj.get("tabs", 0)
    if not isinstance(saved, dict) or len(saved) > MAX_SAVED_ENTRIES:
        raise f.invalid(INVALID_FIELD, f"'saved' must be an object of at most {MAX_SAVED_ENTRIES} entries", "saved")
    for path, size in saved.items():
        if len(path) > 256 or isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise f.invalid(INVALID_FIELD, "'saved' maps a path (at most 256 characters) to a byte count", "saved")
    if isinstance(tabs, bool) or not isinstance(tabs, int) or not 0 <= tabs <= 10_000:
        raise f.invalid(INVALID_FIELD, "'tabs' must be a count", "tabs")
    return SessionEvent(f.choice("change", SESSION_CHANGES), f.token("actor"), tuple(saved.items()), tabs)


def _read_state(f: _Fields) -> ReadState:
    file = f.choice("file", STATE_FILES)
    limit = _count(f, "limit", MAX_READ_BYTES) if "limit" in f.obj else MAX_READ_BYTES
    if limit == 0:
        raise f.invalid(INVALID_FIELD, f"'limit' must be a whole number from 1 to {MAX_READ_BYTES}", "limit")
    offset, after = _count(f, "offset", MAX_STATE_OFFSET), _count(f, "after", MAX_STATE_OFFSET)
    return ReadState("audit" if file == "audit" else "responses", offset, limit, after)


def _put_secrets(f: _Fields) -> PutSecrets:
    """The ``secrets`` list, every entry checked; ``invalid`` names the first bad field (never
    quoting a value)."""
    entries = f.obj.get("secrets")
    if not isinstance(entries, list) or len(entries) > MAX_SECRETS:
        message = f"'secrets' must be a list of at most {MAX_SECRETS} secrets"
        raise f.invalid(INVALID_FIELD, message, "secrets")
    parsed = tuple(_secret(entry, index, f.invalid) for index, entry in enumerate(entries))
    _distinct(parsed, f.invalid)
    return PutSecrets(parsed, f.actor())


def _secret(entry: object, index: int, invalid: Invalid) -> SecretEntry:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise invalid(INVALID_FIELD, "each secret is an object with a 'name'", f"secrets[{index}]")
    name = str(entry["name"])
    where = f"secrets.{name}"
    problem = name_problem(name)
    if problem is not None:
        raise invalid(INVALID_FIELD, problem, where)
    placeholder = entry.get("placeholder")
    if not isinstance(placeholder, str) or PLACEHOLDER.fullmatch(placeholder) is None:
        raise invalid(INVALID_FIELD, "a placeholder is corral_secret_ and 32 hex digits", f"{where}.placeholder")
    value = entry.get("value")  # none: the value the proxy holds stays
    if value is not None:
        problem = value_problem(value) if isinstance(value, str) else "a secret's value is a string"
        if problem is not None:
            raise invalid(INVALID_FIELD, problem, f"{where}.value")
    locations = entry.get("in", list(DEFAULT_LOCATIONS))
    if not isinstance(locations, list) or not locations or not set(locations) <= set(LOCATIONS):
        raise invalid(INVALID_FIELD, f"'in' is a non-empty list of {', '.join(LOCATIONS)}", f"{where}.in")
    allow = entry.get("allow")
    if not _strings(allow) or not 0 < len(_items(allow)) <= MAX_BINDINGS:
        raise invalid(INVALID_FIELD, f"'allow' is a list of 1 to {MAX_BINDINGS} rules", f"{where}.allow")
    text = value if isinstance(value, str) else None
    return SecretEntry(name, placeholder, text, tuple(_items(allow)), tuple(str(loc) for loc in locations))


def _distinct(entries: tuple[SecretEntry, ...], invalid: Invalid) -> None:
    """No two secrets share a name or a placeholder."""
    for attribute in ("name", "placeholder"):
        seen: set[str] = set()
        for entry in entries:
            if getattr(entry, attribute) in seen:
                blame = f"secrets.{entry.name}" + (".placeholder" if attribute == "placeholder" else "")
                raise invalid(INVALID_FIELD, f"two secrets have the same {attribute}", blame)
            seen.add(getattr(entry, attribute))


def _marks(value: object, invalid: Invalid) -> tuple[Head, ...] | None:
    """A read's marks of the audit chain (at most MAX_MARKS, each a Head); None when there are none."""
    if value is None:
        return None
    marks = tuple(Head.parse(item) for item in value) if isinstance(value, list) else None
    if marks is None or len(marks) > MAX_MARKS or any(mark is None for mark in marks):
        raise invalid(INVALID_FIELD, f"'marks' must be a list of at most {MAX_MARKS} chain heads", "marks")
    return tuple(mark for mark in marks if mark is not None)


def _counts(value: object) -> dict[str, int] | None:
    """A JSON object of counts (what is not a count left out); None for anything else."""
    if not isinstance(value, dict):
        return None
    return {str(k): v for k, v in value.items() if isinstance(v, int)}


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _items(value: object) -> list[str]:
    """The strings of a JSON list (nothing for anything else)."""
    return [str(item) for item in value] if isinstance(value, list) else []


_PARSERS: Final[Mapping[str, Callable[[_Fields], Message]]] = {
    Hello.OP: lambda f: Hello(f.text("token")),
    Status.OP: lambda f: Status(),
    SetPolicy.OP: _policy,
    PutSecrets.OP: _put_secrets,
    ActionEvent.OP: _action,
    LeaseEvent.OP: lambda f: LeaseEvent(f.choice("change", LEASE_CHANGES), f.token("holder"), f.token("previous")),
    LinkEvent.OP: _link,
    LifetimeEvent.OP: _lifetime,
    VolumeEvent.OP: _volume,
    ProfileEvent.OP: _profile,
    SessionEvent.OP: _session,
    PreviewEvent.OP: _preview,
    DownloadEvent.OP: _download,
    ReadState.OP: _read_state,
}
