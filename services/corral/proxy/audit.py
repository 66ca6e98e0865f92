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

Every record and every log is bounded. :func:`cap_fields` cuts what a request's sender controls
(the URL, header names and values, the number of headers, any other text) before a record is
hashed, marking each cut with :data:`CUT_MARK` and naming the cut fields in ``truncated``; numbers
(sizes, status, counts) stay as they are. A log given ``max_bytes`` (:class:`LogBudget`) writes
traffic records up to that many bytes, then one ``budget`` record, then only counts: ``tally``
records (per host, event and decision, since the budget was reached), written when the gateway
asks for the chain's head (at most every :data:`TALLY_INTERVAL_S`) and at the log's close. Other
records (policy, secrets, links, control) go on to :attr:`LogBudget.hard_limit`; past it, they are
counted too. Both are records of the chain: a capped log verifies as any other.
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
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, Required, TypedDict, TypeGuard, Unpack, cast

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
    "proxy",
    "connect",
    "request",
    "block",
    "error",
    "policy",
    "recovered",
    "secrets",
    "secret",
    "link",
    "preview",
    "download",
    "lifetime",
    "volume",
    "profile",
    "session",
    "control",
    "budget",
    "tally",
]
Outcome = Literal["allow", "deny", "report"]  # what the proxy did: report lets through and logs a would-be deny
HeaderPairs = Sequence[Sequence[str]]  # [name, value] pairs, as written (tuples) and as read back (lists)


class TallyRow(TypedDict):
    """One row of a ``tally``: how many records of one host, event and decision were counted, not written."""

    host: str
    event: str
    decision: str
    count: int


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
    # preview: a port preview made, revoked, expired, or a connection through it opened or closed (the
    # gateway's report): its id, the sandbox's ``port``, the client's ``remote`` address, and a closed
    # connection's ``bytes_in`` (from the client) and ``bytes_out``
    preview: str
    remote: str
    # download: a download begun or ended in the sandbox's browser (the controller's report: its
    # ``action`` and ``actor``, the bytes it holds) or fetched through the gateway (the gateway's: the
    # caller as ``actor``, the bytes sent); its id (Chromium's GUID), its file ``name`` and ``url``
    download: str
    name: str
    # change: link: created, used, revoked, expired; control: taken, returned, left, requested,
    # request_ended; volume: claimed, released; profile: loaded, saved, failed; session: pause, resume
    change: str
    expires_at: float  # link: its expiry; lifetime: the session's new expiry
    previous_expires_at: float  # lifetime: the session's expiry before the change
    # volume: the session's workspace volume claimed or released (the gateway's report; ``change``:
    # claimed, released); its name and sizes, never what it holds
    volume: str
    size_mb: int
    used_bytes: int
    # profile: a browser profile loaded into the session or saved from it (the gateway's report; never contents)
    profile: str
    bytes: int
    # session: the session paused or resumed (the gateway's report): its saved sizes, never contents
    saved: dict[str, int]  # directory -> bytes
    tabs: int
    # control: a change of the session's control lease (the controller's report)
    holder: str
    previous: str
    # budget: the log's traffic budget was reached; tally: what was counted, not written, since then
    max_bytes: int
    counts: list[TallyRow]  # one per host, event and decision
    dropped: int  # records counted, not written, since the budget was reached
    # any event: the fields cut to the record's caps (cap_fields), each cut marked with CUT_MARK
    truncated: list[str]


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
    "preview": frozenset({"preview", "port", "change", "actor", "expires_at", "remote", "bytes_in", "bytes_out"}),
    "download": frozenset({"download", "name", "url", "change", "bytes", "actor", "action"}),
    "lifetime": frozenset({"actor", "expires_at", "previous_expires_at"}),
    "volume": frozenset({"volume", "change", "size_mb", "used_bytes"}),
    "profile": frozenset({"profile", "change", "bytes", "actor"}),
    "session": frozenset({"change", "actor", "saved", "tabs"}),
    "control": frozenset({"change", "holder", "previous"}),
    "budget": frozenset({"max_bytes"}),
    "tally": frozenset({"counts", "dropped"}),
}
# Any event's record may have had a field cut (cap_fields): its names, in ``truncated``.
EVENT_FIELDS = {event: fields | {"truncated"} for event, fields in EVENT_FIELDS.items()}


# Every field a record can have: the chain's and each event's.
RECORD_FIELDS = AuditRecord.__required_keys__ | AuditRecord.__optional_keys__


# -- caps: one record --------------------------------------------------------------------------------

CUT_MARK = "…"  # ends a cut string; a cut header list ends with the pair [CUT_MARK, "<n> more headers"]
MAX_URL_CHARS = 4096
MAX_HEADER_NAME_CHARS = 128
MAX_HEADER_VALUE_CHARS = 512
MAX_HEADERS = 64  # per direction
MAX_TEXT_CHARS = 1024  # any other string
MAX_ITEMS = 256  # any other list's items or mapping's keys
_HEADER_FIELDS = frozenset({"request_headers", "response_headers"})
# A line of the log no writer of these caps can exceed (headers and URL at their caps, every char
# escaped as JSON escapes it): readers refuse longer lines rather than buffer them.
MAX_LINE_BYTES = 1 << 20


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(CUT_MARK)] + CUT_MARK


_NUMBERS = (int, float, bool)


def _fits(pairs: Sequence[Any]) -> bool:
    """Whether header pairs are within their caps as they are (the usual request's)."""
    try:
        return all(
            type(name) is str
            and type(text) is str
            and len(name) <= MAX_HEADER_NAME_CHARS
            and len(text) <= MAX_HEADER_VALUE_CHARS
            for name, text in pairs
        )
    except (TypeError, ValueError):  # not pairs
        return False


def _cap_headers(value: Any) -> tuple[Any, bool]:
    if not isinstance(value, list | tuple):
        return _cap_value(value)
    if len(value) <= MAX_HEADERS and _fits(value):
        return value, False  # the usual request: nothing to cut, nothing copied
    cut = len(value) > MAX_HEADERS
    pairs: list[Any] = []
    for pair in value[:MAX_HEADERS]:
        if isinstance(pair, list | tuple) and len(pair) == 2:
            name, text = str(pair[0]), str(pair[1])
            if len(name) > MAX_HEADER_NAME_CHARS or len(text) > MAX_HEADER_VALUE_CHARS:
                cut = True
                name, text = _cut(name, MAX_HEADER_NAME_CHARS), _cut(text, MAX_HEADER_VALUE_CHARS)
            pairs.append([name, text])
        else:
            capped, was_cut = _cap_value(pair)
            cut = cut or was_cut
            pairs.append(capped)
    if len(value) > MAX_HEADERS:
        pairs.append([CUT_MARK, f"{len(value) - MAX_HEADERS} more headers"])
    return pairs, cut


def _cap_value(value: Any, limit: int = MAX_TEXT_CHARS, depth: int = 0) -> tuple[Any, bool]:
    """A value with every string, list and mapping in it cut to the caps (numbers as they are), and
    whether anything was cut."""
    if isinstance(value, str):
        return (value, False) if len(value) <= limit else (_cut(value, limit), True)
    if value is None or isinstance(value, (int, float)):  # numbers and null: never cut
        return value, False
    if depth > 4:  # deeper than any record's field: not kept
        return CUT_MARK, True
    if isinstance(value, list | tuple):
        cut = len(value) > MAX_ITEMS
        items = []
        for item in value[:MAX_ITEMS]:
            capped, was_cut = _cap_value(item, depth=depth + 1)
            items.append(capped)
            cut = cut or was_cut
        return items, cut
    if isinstance(value, dict):
        cut = len(value) > MAX_ITEMS
        mapping = {}
        for key, item in list(value.items())[:MAX_ITEMS]:
            name, name_cut = _cap_value(str(key))
            mapping[name], was_cut = _cap_value(item, depth=depth + 1)
            cut = cut or was_cut or name_cut
        return mapping, cut
    return value, False


def cap_fields(fields: Mapping[str, Any]) -> EventFields:
    """``fields`` cut to one record's caps; ``truncated`` names each field that was cut (sorted).

    The URL to :data:`MAX_URL_CHARS`, header names and values to theirs, header lists to
    :data:`MAX_HEADERS` pairs (the rest counted in a last pair), any other string to
    :data:`MAX_TEXT_CHARS` and any other list or mapping to :data:`MAX_ITEMS`. Numbers stay."""
    out: dict[str, object] = {}  # the same fields (EventFields), each its value or its cut value
    cut: list[str] = []
    for name, value in fields.items():
        if name == "truncated":
            continue
        kind = type(value)
        if (kind is str and len(value) <= MAX_TEXT_CHARS) or value is None or kind in _NUMBERS:
            out[name] = value  # the usual field: nothing to cut (checked inline, as every record pays for it)
            continue
        if name in _HEADER_FIELDS:
            out[name], was_cut = _cap_headers(value)
        else:
            out[name], was_cut = _cap_value(value, MAX_URL_CHARS if name == "url" else MAX_TEXT_CHARS)
        if was_cut:
            cut.append(name)
    if cut:
        out["truncated"] = sorted(cut)
    return cast(EventFields, out)


# -- the budget: one log ---------------------------------------------------------------------------

DEFAULT_MAX_BYTES = 64 << 20
# Traffic: what any request of the session adds. Past the budget these are counted, not written.
TRAFFIC_EVENTS: frozenset[str] = frozenset({"connect", "request", "block", "error", "secret"})
TALLY_INTERVAL_S = 10.0  # at most one tally this often when the gateway asks for the head
MAX_TALLY_ROWS = 200  # hosts past these are counted under OTHER_HOSTS
OTHER_HOSTS = "*other*"


class LogBudget:
    """What a log with ``max_bytes`` still writes, and what it counts instead (pure: no file).

    Traffic records are written while the log is below ``max_bytes``; every other record while it is
    below :attr:`hard_limit` (``max_bytes`` and a reserve of an eighth, at least 32 KiB, for the
    marker, the tallies and the session's own changes). What is not written is counted per host,
    event and decision."""

    def __init__(self, max_bytes: int, size: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes <= 0:
            raise ValueError("an audit budget is a positive number of bytes")
        self.max_bytes = max_bytes
        self.hard_limit = max_bytes + max(max_bytes // 8, 32 << 10)
        self.size = size
        self.marked = False  # the budget record is written
        self.counts: dict[tuple[str, str, str], int] = {}
        self.dropped = 0
        self._clock = clock
        self._tallied_at: float | None = None
        self._changed = False

    def admits(self, event: str) -> bool:
        limit = self.max_bytes if event in TRAFFIC_EVENTS else self.hard_limit
        return self.size < limit

    def count(self, event: str, fields: Mapping[str, Any]) -> None:
        host, decision = fields.get("host"), fields.get("decision")
        host = _cut(host, 253) if isinstance(host, str) else ""
        key = (host, event, decision if isinstance(decision, str) else "")
        if key not in self.counts and len(self.counts) >= MAX_TALLY_ROWS:
            key = (OTHER_HOSTS, event, key[2])
        self.counts[key] = self.counts.get(key, 0) + 1
        self.dropped += 1
        self._changed = True

    def restore(self, record: Mapping[str, Any]) -> None:
        """Counts go on from a tally of the log (a restarted proxy continues its log's counts)."""
        rows, dropped = record.get("counts"), record.get("dropped")
        if not isinstance(rows, list) or not isinstance(dropped, int):
            return
        self.counts.clear()
        for row in rows:
            if isinstance(row, dict) and isinstance(row.get("count"), int):
                key = (str(row.get("host", "")), str(row.get("event", "")), str(row.get("decision", "")))
                self.counts[key] = row["count"]
        self.dropped = dropped

    def tally_due(self, final: bool = False) -> bool:
        """Whether to write a tally now: counts changed since the last one, and (unless ``final``)
        the log is below its hard limit and the last one is old enough."""
        if not self._changed:
            return False
        if final:
            return True
        now = self._clock()
        recent = self._tallied_at is not None and now - self._tallied_at < TALLY_INTERVAL_S
        return self.size < self.hard_limit and not recent

    def tally(self) -> EventFields:
        """The tally's fields (counts since the budget was reached), and the counts marked written."""
        self._changed = False
        self._tallied_at = self._clock()
        rows: list[TallyRow] = [
            {"host": host, "event": event, "decision": decision, "count": n}
            for (host, event, decision), n in sorted(self.counts.items())
        ]
        return {"counts": rows, "dropped": self.dropped}


def _digest(record: Mapping[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# Every MARK_EVERY-th record's seq and hash stay in the writer's memory (the last MAX_MARKS of them):
# what a reader of the file that trusts the writer's memory, not the file (the gateway's mirror),
# walks the chain back from, a stretch at a time.
MARK_EVERY = 256
MAX_MARKS = 8192


class AuditLog:
    """Appends records for one session; reopening a log continues its chain (and its budget's counts).

    ``max_bytes``: the log's budget (:class:`LogBudget`); None writes every record."""

    def __init__(
        self, path: Path, session: str, max_bytes: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.session = session
        self._seq = 0
        self._prev = GENESIS
        self.budget = LogBudget(max_bytes, clock=clock) if max_bytes is not None else None
        self.marks: deque[tuple[int, str]] = deque(maxlen=MAX_MARKS)  # (seq, hash) every MARK_EVERY records
        damaged = 0
        ends_cleanly = True
        if path.exists():
            with path.open("rb") as existing:
                for line in bounded_lines(existing, lenient=True):
                    ends_cleanly = line.endswith(b"\n")
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                        self._seq, self._prev = int(record["seq"]), str(record["hash"])
                        self._mark()
                    except (ValueError, KeyError, TypeError):
                        damaged += 1  # kept in place: verify will name it
                        continue
                    self._note_existing(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        if self.budget is not None:
            self.budget.size = os.fstat(self._fd).st_size
        if not ends_cleanly:
            self._append(b"\n")  # a torn last line must not swallow the next record
        if damaged:
            # Continue the chain from the last good record, and say so in it.
            self.write("recovered", damaged_lines=damaged)

    def _note_existing(self, record: Any) -> None:
        if self.budget is None or not isinstance(record, dict):
            return
        if record.get("event") == "budget":
            self.budget.marked = True
        elif record.get("event") == "tally":
            self.budget.restore(record)

    def _append(self, data: bytes) -> None:
        os.write(self._fd, data)
        if self.budget is not None:
            self.budget.size += len(data)

    @property
    def seq(self) -> int:
        """The sequence number of the last record written."""
        return self._seq

    @property
    def head(self) -> ChainHead:
        """The chain's head: ``seq`` and ``hash`` of the last record written (what the gateway anchors)."""
        return {"seq": self._seq, "hash": self._prev}

    def write(self, event: Event, **fields: Unpack[EventFields]) -> AuditRecord | None:
        """The record, cut to the caps and chained; None when the budget counted it instead."""
        budget = self.budget
        if budget is not None and not budget.admits(event):
            if not budget.marked:  # the first record counted rather than written
                budget.marked = True
                self._record("budget", {"max_bytes": budget.max_bytes})
            budget.count(event, fields)
            return None
        return self._record(event, fields)

    def flush_tally(self, final: bool = False) -> None:
        """A tally record, when one is due (:meth:`LogBudget.tally_due`)."""
        if self.budget is not None and self.budget.tally_due(final):
            self._record("tally", self.budget.tally())

    def _record(self, event: Event, fields: Mapping[str, Any]) -> AuditRecord:
        self._seq += 1
        body = cast(
            _Unhashed,
            {
                "seq": self._seq,
                "time": time.time(),
                "session": self.session,
                "event": event,
                **cap_fields(fields),
                "prev": self._prev,
            },
        )
        # The canonical text is made once: hashed, then written with the hash appended (readers
        # re-canonicalise to verify, so where "hash" sits in the line does not matter).
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(text.encode()).hexdigest()
        # One write of a whole line: a reader never sees half a record, a kill loses none already written.
        self._append(f'{text[:-1]},"hash":"{digest}"}}\n'.encode())
        self._prev = digest
        self._mark()
        return {**body, "hash": digest}

    def _mark(self) -> None:
        if self._seq % MARK_EVERY == 0:
            self.marks.append((self._seq, self._prev))

    def marks_after(self, seq: int, limit: int) -> list[ChainHead]:
        """The first ``limit`` marks past ``seq``, oldest first."""
        return [ChainHead(seq=s, hash=h) for s, h in self.marks if s > seq][:limit]

    def close(self) -> None:
        self.flush_tally(final=True)
        os.close(self._fd)


def bounded_lines(
    stream: IO[bytes], limit: int = MAX_LINE_BYTES, lenient: bool = False, size: int | None = None
) -> Iterator[bytes]:
    """The lines of ``stream`` (its first ``size`` bytes, when given), none held longer than ``limit``
    bytes: a longer one raises ValueError naming it (``lenient``: it is skipped whole and stands as
    one line ``b"\\x00\\n"``, not JSON)."""
    number = 0
    left = size

    def read() -> bytes:
        nonlocal left
        if left is None:
            return stream.readline(limit + 1)
        chunk = stream.readline(min(limit + 1, left)) if left > 0 else b""
        left -= len(chunk)
        return chunk

    while True:
        line = read()
        if not line:
            return
        number += 1
        if len(line) > limit and not line.endswith(b"\n"):
            if not lenient:
                raise ValueError(f"line {number}: longer than {limit} bytes (no audit record is)")
            while line and not line.endswith(b"\n"):
                line = read()
            yield b"\x00\n"
            continue
        yield line


@dataclass(frozen=True, slots=True)
class Link:
    """One whole record line as a link of a chain: its ``seq``, the ``prev`` it names, its own ``hash``."""

    seq: int
    prev: str
    hash: str
    line: bytes = field(repr=False)


def link_of(line: bytes) -> Link | None:
    """``line`` as a link when it is a whole record whose hash is its content's (what the writer
    wrote, or a forger who hashed it: which chain it belongs to is the reader's to judge); else None."""
    if len(line) > MAX_LINE_BYTES or not line.endswith(b"\n"):
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # nesting past the parser's depth is garbage too, never a raise
        return None
    if not isinstance(record, dict) or not isinstance(record.get("prev"), str):
        return None
    seq = record.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or record.get("hash") != _digest(record):
        return None
    # Only the writer's own spelling of it (AuditLog._record's): the same fields spelled otherwise (a
    # key given twice, other spacing or escapes) hash the same, and a reader of other bytes (another
    # JSON parser, a grep) may read other fields there.
    if line != _spelled(record):
        return None
    return Link(seq, record["prev"], record["hash"], line)


def _spelled(record: Mapping[str, Any]) -> bytes:
    """``record``'s line as :meth:`AuditLog._record` writes it: its canonical text, the hash last."""
    body = json.dumps({k: v for k, v in record.items() if k != "hash"}, sort_keys=True, separators=(",", ":"))
    return f'{body[:-1]},"hash":"{record["hash"]}"}}\n'.encode()


@dataclass(frozen=True, slots=True)
class Verification:
    ok: bool
    records: int
    first_bad: int | None = None  # line number, from 1
    reason: str = ""


def verify(path: Path) -> Verification:
    """Check the whole chain; names the first record that was changed, removed, inserted or moved.

    Reads one line at a time (none longer than :data:`MAX_LINE_BYTES`): memory stays flat."""
    return _walk(path, frozenset())[0]


def _walk(path: Path, keep: frozenset[int]) -> tuple[Verification, dict[int, str], str | None]:
    """The chain check, with the hash of each good record whose seq is in ``keep``, and the log's session."""
    prev = GENESIS
    count = 0
    hashes: dict[int, str] = {}
    session: str | None = None
    with path.open("rb") as log:
        for number, line in enumerate(bounded_lines(log, lenient=True), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                reason = "longer than any audit record" if line == b"\x00\n" else "not valid JSON"
                return Verification(False, count, number, reason), hashes, session
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
            count += 1
            if count in keep:
                hashes[count] = prev
    return Verification(True, count), hashes, session


# -- anchors --------------------------------------------------------------------------------------

ANCHOR_VERSION = 1
_HEX64 = frozenset("0123456789abcdef")


class ChainHead(TypedDict):
    """Where a chain ends: the last record's ``seq`` and ``hash`` (``0`` and :data:`GENESIS` before any)."""

    seq: int
    hash: str


class AnchoredPolicy(TypedDict):
    """The policy an anchor says the gateway set (its ``set``)."""

    generation: int
    allow: list[str]
    mode: str


class AnchorFields(TypedDict, total=False):
    """What an anchor may hold besides the head: the proxy's policy generation, and the policy set."""

    generation: int | None
    set: AnchoredPolicy


class _UnkeyedAnchor(AnchorFields):
    v: Required[int]
    session: Required[str]
    time: Required[float]
    reason: Required[str]
    seq: Required[int]
    hash: Required[str]


class Anchor(_UnkeyedAnchor, total=False):
    """One line of a session's anchors file: the chain's head as the proxy reported it, keyed.
    Read back, it is checked (:func:`parse_anchors`) before it is typed as one."""

    mac: Required[str]  # HMAC-SHA256 of the anchor's canonical JSON without this field


class AnchorSummary(TypedDict):
    seq: int
    time: float
    reason: str


class AnchoredReport(TypedDict):
    """:meth:`AnchoredVerification.to_dict`: what ``corral audit verify`` prints."""

    ok: bool
    status: AnchoredStatus
    records: int
    first_bad: int | None
    reason: str
    anchors: int
    proven: int
    unproven: int | None
    anchor: AnchorSummary | None
    message: str


def _anchor_body(anchor: _UnkeyedAnchor) -> bytes:
    return json.dumps({k: v for k, v in anchor.items() if k != "mac"}, sort_keys=True, separators=(",", ":")).encode()


def anchor_mac(key: bytes, anchor: _UnkeyedAnchor) -> str:
    """HMAC-SHA256 of the anchor's canonical JSON (without ``mac``)."""
    return hmac.new(key, _anchor_body(anchor), hashlib.sha256).hexdigest()


def make_anchor(
    key: bytes,
    session: str,
    seq: int,
    chain_hash: str,
    reason: str,
    at: float | None = None,
    **fields: Unpack[AnchorFields],
) -> Anchor:
    """One anchor: the chain's head ``(seq, hash)`` as the proxy reported it, keyed with ``key``."""
    unkeyed: _UnkeyedAnchor = {
        "v": ANCHOR_VERSION,
        "session": session,
        "time": time.time() if at is None else at,
        "reason": reason,
        "seq": seq,
        "hash": chain_hash,
        **fields,
    }
    return {**unkeyed, "mac": anchor_mac(key, unkeyed)}


def parse_anchors(lines: Sequence[bytes | str], key: bytes | None = None) -> list[Anchor]:
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


def _is_anchor(anchor: Any) -> TypeGuard[Anchor]:
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
    anchor: Anchor | None = None  # the failing anchor, or the last matching one
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("intact", "unanchored")

    @property
    def unproven(self) -> int:
        """Records after the last anchor: the chain vouches for them, no anchor does."""
        return max(0, self.chain.records - self.proven)

    def to_dict(self) -> AnchoredReport:
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
            "anchor": _summary(self.anchor) if self.anchor else None,
            "message": self.message,
        }


def _summary(anchor: Anchor) -> AnchorSummary:
    return {"seq": anchor["seq"], "time": anchor["time"], "reason": anchor["reason"]}


def _when(anchor: Anchor) -> str:
    at = anchor.get("time")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "at an unknown time"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def verify_anchored(path: Path, anchors: Sequence[Anchor]) -> AnchoredVerification:
    """Check the chain, then every anchor against it (see :class:`AnchoredVerification`).

    Raises ValueError when the anchors belong to another session than the log.
    """
    chain, hashes, session = _walk(path, frozenset(int(a["seq"]) for a in anchors))
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
    last: Anchor | None = None
    for anchor in sorted(anchors, key=lambda a: (int(a["seq"]), float(a.get("time") or 0))):
        seq = int(anchor["seq"])
        if seq > chain.records:
            message = (
                f"truncated: the gateway anchored record {seq} ({_when(anchor)}, {anchor.get('reason')}), "
                f"the log ends at record {chain.records}"
            )
            return AnchoredVerification("truncated", chain, len(anchors), _seq_of(last), anchor, message)
        if seq > 0 and hashes.get(seq) != anchor["hash"]:
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


def _seq_of(anchor: Anchor | None) -> int:
    return int(anchor["seq"]) if anchor is not None else 0
