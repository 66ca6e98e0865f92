"""The audit log: JSON Lines, one record per event, each carrying the SHA-256 of the one before.

``prev`` of the first record is 64 zeros; ``hash`` is the SHA-256 of the record's canonical JSON
(sorted keys, no spaces) without ``hash``. Changing, removing, inserting or reordering a record
breaks the chain at that record, and :func:`verify` names it. Each record is written with one
``write`` and flushed, so a proxy killed mid-session loses nothing it already logged.

The chain alone proves internal consistency only: a log cut short, or rewritten as a whole with
fresh hashes, verifies too. Anchors close that: the gateway asks the proxy for its chain head
(``seq``, ``hash``) during the session and at its end, and keeps each answer as one keyed line
(HMAC-SHA256 with a secret only the gateway reads) where the proxy cannot write.
:func:`verify_anchored` checks a log against them: every anchored record must still be there with
the anchored hash.

:class:`AuditRecord` is the record's type: the writer (:meth:`AuditLog.write`, fed by the egress
addons) and every reader (:mod:`corral.proxy.traffic`, the CLI's ``audit`` commands, the session
viewer) use it, and docs/egress.md's field table is checked against it and :data:`EVENT_FIELDS`.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Required, TypedDict, Unpack

GENESIS = "0" * 64
REDACTED = "[redacted]"
_SECRET_HEADER = re.compile(r"token|secret|passw|api-?key|auth|cookie|session|csrf|xsrf|signature|credential", re.I)
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-amz-security-token",
        "x-goog-api-key",
    }
)
# Long words anywhere in a name (accessToken, apikey, sessionid); short ones only as a whole part.
_SECRET_QUERY = re.compile(
    r"token|secret|passw|apikey|api_key|api-key|auth|credential|session|signature"
    r"|(^|_|-|\.)(key|pwd|sig|code|jwt|sid)s?($|_|-|\.)",
    re.I,
)


@functools.lru_cache(maxsize=1024)
def _secret_header(name: str) -> bool:
    # Cached: a proxy sees the same few dozen header names over and over.
    return name.lower() in SECRET_HEADERS or _SECRET_HEADER.search(name) is not None


def is_secret_header(name: str) -> bool:
    """Whether a header carries a credential (the audit log redacts it; recorded responses blank it)."""
    return _secret_header(name)


def redact_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(name, REDACTED if _secret_header(name) else value) for name, value in headers]


def redact_url(url: str) -> str:
    """The URL with the values of secret-looking query parameters (and any user info) replaced."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    if not parts.query:
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    query = urllib.parse.urlencode([(k, REDACTED if _SECRET_QUERY.search(k) else v) for k, v in pairs], safe="[]")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


# -- the record ------------------------------------------------------------------------------------

Event = Literal[
    "proxy", "connect", "request", "block", "error", "policy", "recovered", "secrets", "secret", "link", "control"
]
Outcome = Literal["allow", "deny", "report"]  # what the proxy did: report lets through and logs a would-be deny
HeaderPairs = Sequence[Sequence[str]]  # [name, value] pairs, as written (tuples) and as read back (lists)


class EventFields(TypedDict, total=False):
    """What one event says, besides its name; :data:`EVENT_FIELDS` names the fields each event carries."""

    # proxy, policy
    mode: str
    allow: list[str]
    version: str
    hermetic: bool | None
    recorded_responses: int | None
    previous_allow: list[str]
    previous_mode: str
    # policy, secrets, link: who made the change; traffic: who acted, when not the agent (human:…, cdp:…)
    actor: str
    generation: int
    # traffic: connect, request, block, error
    id: str
    started: float
    method: str
    url: str | None
    scheme: str
    host: str
    port: int
    ip: str | None
    client: str | None
    sni: str | None
    http_version: str
    status: int
    request_headers: HeaderPairs
    response_headers: HeaderPairs
    mime: str | None
    bytes_out: int
    bytes_in: int
    duration_ms: float
    decision: Outcome
    rule: str | None
    reason: str
    action: str | None
    action_source: Literal["command"]  # only when a command named the action (corral.proxy.attribution)
    replayed: bool
    error: str
    # recovered
    damaged_lines: int
    # secrets: a change of the session's brokered secrets (names and bindings; never a value)
    added: list[str]
    rotated: list[str]
    revoked: list[str]
    restored: list[str]  # values sent again to a restarted proxy
    bindings: dict[str, dict[str, list[str]]]  # name -> {"allow": [...], "in": [...]}, after the change
    # secret: one use of a secret (substituted or scrubbed); block: a refusal because of one
    secret: str  # the secret's name
    location: str  # header, query, body, basic; response-header, response-body; websocket
    count: int
    exfiltration: bool  # a block: a placeholder or value headed where its secret is not bound
    # link: a viewer link made, used, revoked or expired (the gateway's report); its ``actor`` is the owner's key
    link: str
    change: str  # link: created, used, revoked, expired; control: taken, returned, left, requested, request_ended
    expires_at: float
    # control: a change of the session's control lease (the controller's report)
    holder: str
    previous: str


class _Unhashed(EventFields, total=False):
    seq: Required[int]
    time: Required[float]
    session: Required[str]
    event: Required[Event]
    prev: Required[str]  # the hash of the record before (GENESIS for the first)


class AuditRecord(_Unhashed, total=False):
    """One line of the audit log: an event, its fields and its place in the chain.

    The type of what the proxy writes. A log read back is input all the same: readers still check
    each value they use (a file can hold anything)."""

    hash: Required[str]  # SHA-256 of the record's canonical JSON without this field


CHAIN_FIELDS = frozenset({"seq", "time", "session", "event", "prev", "hash"})
_TRAFFIC = ("host", "port", "ip", "action", "action_source", "actor", "decision", "rule", "reason")
_EXCHANGE = (
    *("id", "started", "method", "url", "scheme", "sni", "http_version", "status"),
    *("request_headers", "response_headers", "mime", "bytes_out", "bytes_in", "duration_ms", *_TRAFFIC),
)
EVENT_FIELDS: Mapping[Event, frozenset[str]] = {
    "proxy": frozenset({"mode", "allow", "version", "hermetic", "recorded_responses"}),
    "connect": frozenset({*_TRAFFIC, "client"}),
    "request": frozenset({*_EXCHANGE, "replayed"}),  # replayed: only when true (a hermetic session's answer)
    "block": frozenset({*_EXCHANGE, "secret", "location", "exfiltration"}),
    # A failed request: these; a connection refused before any request: host, port, error, action(_source).
    "error": frozenset(
        {
            *("id", "method", "url", "host", "port", "ip", "error"),
            *("action", "action_source", "actor", "decision", "duration_ms"),
        }
    ),
    "policy": frozenset({"allow", "mode", "previous_allow", "previous_mode", "actor", "generation"}),
    "recovered": frozenset({"damaged_lines"}),
    "secrets": frozenset({"actor", "generation", "added", "rotated", "revoked", "restored", "bindings"}),
    "secret": frozenset(
        {
            "id",
            "method",
            "url",
            "host",
            "port",
            "action",
            "action_source",
            "actor",
            "rule",
            "secret",
            "location",
            "count",
        }
    ),
    "link": frozenset({"link", "mode", "change", "actor", "expires_at"}),
    "control": frozenset({"change", "holder", "previous"}),
}


# Every field a record can have: the chain's and each event's.
RECORD_FIELDS = AuditRecord.__required_keys__ | AuditRecord.__optional_keys__


def _digest(record: Mapping[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class AuditLog:
    """Appends records for one session; reopening a log continues its chain."""

    def __init__(self, path: Path, session: str) -> None:
        self.path = path
        self.session = session
        self._seq = 0
        self._prev = GENESIS
        damaged = 0
        ends_cleanly = True
        if path.exists():
            with path.open("rb") as existing:
                for line in existing:
                    ends_cleanly = line.endswith(b"\n")
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                        self._seq, self._prev = int(record["seq"]), str(record["hash"])
                    except (ValueError, KeyError, TypeError):
                        damaged += 1  # kept in place: verify will name it
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        if not ends_cleanly:
            os.write(self._fd, b"\n")  # a torn last line must not swallow the next record
        if damaged:
            # Continue the chain from the last good record, and say so in it.
            self.write("recovered", damaged_lines=damaged)

    @property
    def seq(self) -> int:
        """The sequence number of the last record written."""
        return self._seq

    @property
    def head(self) -> dict[str, Any]:
        """The chain's head: ``seq`` and ``hash`` of the last record written (what the gateway anchors)."""
        return {"seq": self._seq, "hash": self._prev}

    def write(self, event: Event, **fields: Unpack[EventFields]) -> AuditRecord:
        self._seq += 1
        body: _Unhashed = {
            "seq": self._seq,
            "time": time.time(),
            "session": self.session,
            "event": event,
            **fields,
            "prev": self._prev,
        }
        # The canonical text is made once: hashed, then written with the hash appended (readers
        # re-canonicalise to verify, so where "hash" sits in the line does not matter).
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(text.encode()).hexdigest()
        # One write of a whole line: a reader never sees half a record, a kill loses none already written.
        os.write(self._fd, f'{text[:-1]},"hash":"{digest}"}}\n'.encode())
        self._prev = digest
        return {**body, "hash": digest}

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True, slots=True)
class Verification:
    ok: bool
    records: int
    first_bad: int | None = None  # line number, from 1
    reason: str = ""


def verify(path: Path) -> Verification:
    """Check the whole chain; names the first record that was changed, removed, inserted or moved."""
    return _walk(path)[0]


def _walk(path: Path) -> tuple[Verification, list[str], str | None]:
    """The chain check, with the hash of each good record (by seq) and the log's session."""
    prev = GENESIS
    hashes: list[str] = []
    session: str | None = None
    with path.open("rb") as log:
        for number, line in enumerate(log, start=1):
            if not line.strip():
                continue
            count = len(hashes)
            try:
                record = json.loads(line)
            except ValueError:
                return Verification(False, count, number, "not valid JSON"), hashes, session
            if not isinstance(record, dict) or "hash" not in record or "prev" not in record:
                return Verification(False, count, number, "not an audit record"), hashes, session
            if record["prev"] != prev:
                return Verification(False, count, number, "does not follow the record before it"), hashes, session
            if record["hash"] != _digest(record):
                return Verification(False, count, number, "its content was changed"), hashes, session
            if record.get("seq") != count + 1:
                reason = f"sequence number {record.get('seq')} where {count + 1} was due"
                return Verification(False, count, number, reason), hashes, session
            if session is None and isinstance(record.get("session"), str):
                session = record["session"]
            prev = record["hash"]
            hashes.append(prev)
    return Verification(True, len(hashes)), hashes, session


# -- anchors --------------------------------------------------------------------------------------

ANCHOR_VERSION = 1
_HEX64 = frozenset("0123456789abcdef")


def _anchor_body(anchor: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in anchor.items() if k != "mac"}, sort_keys=True, separators=(",", ":")).encode()


def anchor_mac(key: bytes, anchor: dict[str, Any]) -> str:
    """HMAC-SHA256 of the anchor's canonical JSON (without ``mac``)."""
    return hmac.new(key, _anchor_body(anchor), hashlib.sha256).hexdigest()


def make_anchor(
    key: bytes, session: str, seq: int, chain_hash: str, reason: str, at: float | None = None, **fields: Any
) -> dict[str, Any]:
    """One anchor: the chain's head ``(seq, hash)`` as the proxy reported it, keyed with ``key``."""
    anchor: dict[str, Any] = {
        "v": ANCHOR_VERSION,
        "session": session,
        "time": time.time() if at is None else at,
        "reason": reason,
        "seq": seq,
        "hash": chain_hash,
        **fields,
    }
    anchor["mac"] = anchor_mac(key, anchor)
    return anchor


def parse_anchors(lines: Sequence[bytes | str], key: bytes | None = None) -> list[dict[str, Any]]:
    """Anchors from JSON Lines; with ``key``, each one's MAC is checked. Raises ValueError naming the line."""
    anchors = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            anchor = json.loads(line)
        except ValueError:
            raise ValueError(f"anchor line {number}: not valid JSON") from None
        if not _is_anchor(anchor):
            raise ValueError(f"anchor line {number}: not an audit anchor")
        if key is not None and not hmac.compare_digest(anchor["mac"], anchor_mac(key, anchor)):
            raise ValueError(f"anchor line {number}: its MAC does not match the key (not the gateway's anchor)")
        anchors.append(anchor)
    return anchors


def _is_anchor(anchor: Any) -> bool:
    if not isinstance(anchor, dict) or anchor.get("v") != ANCHOR_VERSION:
        return False
    seq, chain_hash = anchor.get("seq"), anchor.get("hash")
    return (
        isinstance(anchor.get("session"), str)
        and isinstance(anchor.get("mac"), str)
        and isinstance(seq, int)
        and not isinstance(seq, bool)
        and seq >= 0
        and isinstance(chain_hash, str)
        and len(chain_hash) == 64
        and set(chain_hash) <= _HEX64
        and (seq > 0 or chain_hash == GENESIS)  # an anchor before the first record holds the genesis
    )


AnchoredStatus = Literal["intact", "unanchored", "truncated", "rewritten", "altered"]


@dataclass(frozen=True, slots=True)
class AnchoredVerification:
    """A log checked against its chain and its anchors.

    ``status``: ``intact`` (chain whole, every anchor matches), ``unanchored`` (chain whole, no
    anchors: internal consistency only), ``truncated`` (an anchored record is missing), ``rewritten``
    (an anchored record has another hash), ``altered`` (the chain itself is broken).
    """

    status: AnchoredStatus
    chain: Verification
    anchors: int
    proven: int = 0  # records 1..proven are the ones the proxy had written when last anchored
    anchor: dict[str, Any] | None = None  # the failing anchor, or the last matching one
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("intact", "unanchored")

    @property
    def unproven(self) -> int:
        """Records after the last anchor: the chain vouches for them, no anchor does."""
        return max(0, self.chain.records - self.proven)

    def to_dict(self) -> dict[str, Any]:
        c = self.chain
        return {
            "ok": self.ok,
            "status": self.status,
            "records": c.records,
            "first_bad": c.first_bad,
            "reason": c.reason,
            "anchors": self.anchors,
            "proven": self.proven,
            "unproven": self.unproven if c.ok else None,
            "anchor": {k: self.anchor[k] for k in ("seq", "time", "reason")} if self.anchor else None,
            "message": self.message,
        }


def _when(anchor: dict[str, Any]) -> str:
    at = anchor.get("time")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "at an unknown time"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def verify_anchored(path: Path, anchors: Sequence[dict[str, Any]]) -> AnchoredVerification:
    """Check the chain, then every anchor against it (see :class:`AnchoredVerification`).

    Raises ValueError when the anchors belong to another session than the log.
    """
    chain, hashes, session = _walk(path)
    for anchor in anchors:
        if session is not None and anchor["session"] != session:
            raise ValueError(f"the anchors are of session {anchor['session']}, the log of session {session}")
    if not chain.ok:
        message = f"record at line {chain.first_bad} {chain.reason} ({chain.records} records before it are intact)"
        return AnchoredVerification("altered", chain, len(anchors), message=message)
    unanchored = (
        f"{chain.records} records, chain intact; no anchor covers a record: this proves only that the log is "
        "internally consistent (a log cut short, or rewritten as a whole, would verify too)"
    )
    if not anchors:
        return AnchoredVerification("unanchored", chain, 0, message=unanchored)
    last: dict[str, Any] | None = None
    for anchor in sorted(anchors, key=lambda a: (int(a["seq"]), float(a.get("time") or 0))):
        seq = int(anchor["seq"])
        if seq > chain.records:
            message = (
                f"truncated: the gateway anchored record {seq} ({_when(anchor)}, {anchor.get('reason')}), "
                f"the log ends at record {chain.records}"
            )
            return AnchoredVerification("truncated", chain, len(anchors), _seq_of(last), anchor, message)
        if seq > 0 and hashes[seq - 1] != anchor["hash"]:
            message = (
                f"rewritten: record {seq} is not the one the gateway anchored ({_when(anchor)}, {anchor.get('reason')})"
            )
            return AnchoredVerification("rewritten", chain, len(anchors), _seq_of(last), anchor, message)
        last = anchor
    assert last is not None
    proven = int(last["seq"])
    if proven == 0:  # only anchors from before the proxy's first record
        return AnchoredVerification("unanchored", chain, len(anchors), 0, last, unanchored)
    later = chain.records - proven
    message = (
        f"{chain.records} records, chain intact, {len(anchors)} anchors match: records 1-{proven} are the ones "
        f"the proxy had written at the last anchor ({_when(last)}, {last.get('reason')})"
        + (f"; the {later} after it are vouched for by the chain only" if later else "")
    )
    return AnchoredVerification("intact", chain, len(anchors), proven, last, message)


def _seq_of(anchor: dict[str, Any] | None) -> int:
    return int(anchor["seq"]) if anchor is not None else 0
