"""Reading a session's audit log as traffic: filter its records, export them as HAR, sum them per host.

Pure functions over :class:`~corral.proxy.audit.AuditRecord` (the fields each event carries:
:data:`~corral.proxy.audit.EVENT_FIELDS`); nothing here checks the chain, which is
:func:`~corral.proxy.audit.verify`'s job. A log read back is input: every value used is checked.
The events as traffic:

- ``request``: a completed request (decision ``allow``, or ``report`` when the policy would have
  refused it but runs in report mode);
- ``block``: a request refused by the proxy and never sent upstream, with the same fields (the
  response is the refusal page the proxy answered with);
- ``error``: a request or connection that failed (``url`` and ``method`` may be None or absent);
- ``connect``: a CONNECT tunnel and its ``decision``; ``proxy`` and ``policy``: no traffic;
- ``secret``: one use of a brokered secret in one request or answer (rule ``secret-substitution``
  or ``secret-reflection``, with its ``count``), beside that exchange's ``request`` record;
  ``secrets``: a change of the session's secrets (names and bindings). A ``block`` with a
  ``secret`` field is a refusal because of one (rule ``secret-misuse``, flagged ``exfiltration``,
  or ``secret-unavailable``). None of them holds a value.
"""

from __future__ import annotations

import datetime as dt
import heapq
import http
import json
import math
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast, get_args

from corral.proxy.audit import AuditRecord, Event, Outcome, bounded_lines
from corral.proxy.hosts import normalize_host, parse_ip

EVENTS = frozenset(get_args(Event)) - {"recovered"}  # the events a filter can ask for
DECISIONS = frozenset(get_args(Outcome))
HAR_VERSION = "1.2"
UNKNOWN_MIME = "x-unknown"
# The rules of the records about brokered secrets (corral.proxy.addons.broker).
SUBSTITUTION, REFLECTION = "secret-substitution", "secret-reflection"
MISUSE, UNAVAILABLE = "secret-misuse", "secret-unavailable"

__all__ = [
    "DECISIONS",
    "EVENTS",
    "AuditRecord",
    "HostSummary",
    "SecretSummary",
    "TrafficFilter",
    "har_chunks",
    "is_har_entry",
    "is_secret_record",
    "parse_records",
    "parse_time",
    "read_records",
    "summarize",
    "summarize_secrets",
    "to_har",
    "totals",
]
# HAR entries are sorted by start within a window of this many (records are written as requests end,
# so a long request's record comes after shorter ones that started later): memory stays bounded.
HAR_WINDOW = 256


def parse_records(lines: Iterable[str | bytes], *, source: str = "") -> Iterator[AuditRecord]:
    """The records of JSON Lines text; blank lines are skipped, anything else that is not a JSON
    object raises ValueError naming its line (from 1) and ``source``."""
    where = f"{source}: " if source else ""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError for bytes
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise ValueError(f"{where}line {number}: not valid JSON ({detail})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}line {number}: not an audit record (not a JSON object)")
        yield cast(AuditRecord, record)  # in shape only: readers check each value they use


def read_records(path: Path) -> Iterator[AuditRecord]:
    """The records of an audit log file, read lazily, one bounded line at a time (a line longer than
    any record raises ValueError); see :func:`parse_records` for the other errors."""
    with path.open("rb") as log:
        try:
            yield from parse_records(bounded_lines(log), source=str(path))
        except ValueError as exc:
            if str(exc).startswith(str(path)):
                raise
            raise ValueError(f"{path}: {exc}") from None


def parse_time(value: str | float) -> float:
    """Unix seconds from a number or its text, or from ISO 8601 text (UTC when it names no zone)."""
    if isinstance(value, int | float):
        number = float(value)
    else:
        try:
            number = float(value.strip())
        except ValueError:
            return _parse_iso(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number of seconds: {value!r}")
    return number


def _parse_iso(value: str) -> float:
    text = value.strip()
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not unix seconds or an ISO 8601 time: {value!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _canonical_host(host: str) -> str:
    try:
        return normalize_host(host)
    except ValueError:
        return host.strip().lower()


@dataclass(frozen=True, slots=True)
class TrafficFilter:
    """Which records to keep; every field that is set must match (None matches anything).

    ``host`` is one host (any spelling :func:`~corral.proxy.hosts.normalize_host` accepts), or
    ``*.example.com`` for the subdomains of example.com (not example.com itself), as in the
    policy. ``since`` and ``until`` bound a record's ``time`` (unix seconds, both inclusive).
    ``secrets`` keeps only the records about brokered secrets (:func:`is_secret_record`).
    Invalid values raise ValueError; :meth:`parse` builds one from command-line text.
    """

    host: str | None = None
    decision: str | None = None
    event: str | None = None
    action: str | None = None
    since: float | None = None
    until: float | None = None
    secrets: bool = False

    def __post_init__(self) -> None:
        if self.host is not None:
            wildcard = self.host.startswith("*.")
            name = self.host[2:] if wildcard else self.host
            if "*" in name:
                raise ValueError(f"host: a wildcard may only lead a host ('*.example.com'): {self.host!r}")
            try:
                canonical = normalize_host(name)
            except ValueError as exc:
                raise ValueError(f"host: {exc}") from None
            if wildcard and parse_ip(canonical) is not None:
                raise ValueError(f"host: a wildcard needs a domain, not an address: {self.host!r}")
            object.__setattr__(self, "host", f"*.{canonical}" if wildcard else canonical)
        if self.decision is not None and self.decision not in DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(sorted(DECISIONS))}, not {self.decision!r}")
        if self.event is not None and self.event not in EVENTS:
            raise ValueError(f"event must be one of {', '.join(sorted(EVENTS))}, not {self.event!r}")
        if self.action is not None and not self.action:
            raise ValueError("action must not be empty")
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
            ):
                raise ValueError(f"{name} must be a finite number of unix seconds, not {value!r}")
        if self.since is not None and self.until is not None and self.since > self.until:
            raise ValueError(f"since ({_iso(self.since)}) is after until ({_iso(self.until)})")

    @classmethod
    def parse(
        cls,
        *,
        host: str | None = None,
        decision: str | None = None,
        event: str | None = None,
        action: str | None = None,
        since: str | float | None = None,
        until: str | float | None = None,
        secrets: bool = False,
    ) -> TrafficFilter:
        """A filter from text as typed: decision and event in any case, times as unix seconds or ISO 8601."""

        def when(name: str, value: str | float | None) -> float | None:
            if value is None:
                return None
            try:
                return parse_time(value)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None

        return cls(
            host=host.strip() if host is not None else None,
            decision=decision.strip().lower() if decision is not None else None,
            event=event.strip().lower() if event is not None else None,
            action=action.strip() if action is not None else None,
            since=when("since", since),
            until=when("until", until),
            secrets=secrets,
        )

    def matches(self, record: AuditRecord) -> bool:
        if self.secrets and not is_secret_record(record):
            return False
        if self.event is not None and record.get("event") != self.event:
            return False
        if self.decision is not None and record.get("decision") != self.decision:
            return False
        if self.action is not None and record.get("action") != self.action:
            return False
        if self.since is not None or self.until is not None:
            time = record.get("time")
            if not isinstance(time, int | float) or isinstance(time, bool):
                return False
            if (self.since is not None and time < self.since) or (self.until is not None and time > self.until):
                return False
        if self.host is not None:
            host = record.get("host")
            if not isinstance(host, str) or not host:
                return False
            canonical = _canonical_host(host)
            if self.host.startswith("*."):
                return canonical.endswith(self.host[1:])
            return canonical == self.host
        return True

    def apply(self, records: Iterable[AuditRecord]) -> Iterator[AuditRecord]:
        return (record for record in records if self.matches(record))


def is_secret_record(record: AuditRecord) -> bool:
    """Whether a record is about brokered secrets: a ``secrets`` change, a ``secret`` use, or a
    ``block`` because of one (it names the secret, or its rule is a secret's: misuse, unavailable, or
    an answer that could not be decoded to take values out of it, ``secret-reflection``)."""
    event = record.get("event")
    if event in ("secrets", "secret"):
        return True
    rule = record.get("rule")
    return event == "block" and (record.get("secret") is not None or rule in (MISUSE, UNAVAILABLE, REFLECTION))


def _iso(seconds: float) -> str:
    """ISO 8601 in UTC with milliseconds, as HAR wants; the plain number where no date can hold it."""
    try:
        text = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return str(seconds)
    return text.removesuffix("+00:00") + "Z"


def _number(value: Any, default: float = 0.0) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return default


def _count(value: Any, default: int = 0) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return default


class HarNameValue(TypedDict):
    name: str
    value: str


class HarContent(TypedDict):
    size: int
    mimeType: str


class HarRequest(TypedDict):
    method: str
    url: str
    httpVersion: str
    cookies: list[HarNameValue]
    headers: list[HarNameValue]
    queryString: list[HarNameValue]
    headersSize: int
    bodySize: int


class HarResponse(TypedDict):
    status: int
    statusText: str
    httpVersion: str
    cookies: list[HarNameValue]
    headers: list[HarNameValue]
    content: HarContent
    redirectURL: str
    headersSize: int
    bodySize: int


class HarCache(TypedDict):
    """Empty: the proxy knows nothing of a browser's cache."""


class HarTimings(TypedDict):
    send: float
    wait: float
    receive: float


# One HAR entry: HAR 1.2's fields, then Corral's own (an underscore first, as HAR allows; see har_chunks):
# ``_id`` to ``_sni`` are always there, set after ``serverIPAddress`` (hence not required at first).
class HarEntry(TypedDict):
    """One HAR entry (:func:`to_har`)."""

    startedDateTime: str
    time: float
    request: HarRequest
    response: HarResponse
    cache: HarCache
    timings: HarTimings
    serverIPAddress: NotRequired[str]
    _id: NotRequired[str | None]
    _seq: NotRequired[int | None]
    _event: NotRequired[Event | None]
    _decision: NotRequired[Outcome | None]
    _rule: NotRequired[str | None]
    _reason: NotRequired[str | None]
    _action: NotRequired[str | None]
    _sni: NotRequired[str | None]
    _action_source: NotRequired[str]
    _actor: NotRequired[str]
    _secret: NotRequired[str]
    _location: NotRequired[str | None]
    _exfiltration: NotRequired[bool]
    _error: NotRequired[str]


class HarCreator(TypedDict):
    name: str
    version: str


class HarLog(TypedDict):
    version: str
    creator: HarCreator
    entries: list[HarEntry]


class HarDocument(TypedDict):
    log: HarLog


def _headers(value: Any) -> list[HarNameValue]:
    if not isinstance(value, list):
        return []
    return [{"name": str(pair[0]), "value": str(pair[1])} for pair in value if isinstance(pair, list | tuple)]


def _status_text(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def _har_entry(record: AuditRecord) -> HarEntry:
    event = record.get("event")
    url = str(record.get("url") or "")
    duration = max(0.0, _number(record.get("duration_ms")))
    started = _number(record.get("started"), _number(record.get("time")))
    query = urllib.parse.urlsplit(url).query
    http_version = str(record.get("http_version") or "")
    request_headers = _headers(record.get("request_headers"))
    request: HarRequest = {
        "method": str(record.get("method") or ""),
        "url": url,
        "httpVersion": http_version,
        "cookies": [],
        "headers": request_headers,
        "queryString": [
            {"name": name, "value": value} for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True)
        ],
        "headersSize": -1,
        "bodySize": _count(record.get("bytes_out"), -1 if event == "error" else 0),
    }
    if event == "error":
        response: HarResponse = {
            "status": 0,
            "statusText": "",
            "httpVersion": "",
            "cookies": [],
            "headers": [],
            "content": {"size": 0, "mimeType": UNKNOWN_MIME},
            "redirectURL": "",
            "headersSize": -1,
            "bodySize": -1,
        }
    else:
        status = _count(record.get("status"))
        response_headers = _headers(record.get("response_headers"))
        bytes_in = _count(record.get("bytes_in"))
        location = next((h["value"] for h in response_headers if h["name"].lower() == "location"), "")
        response = {
            "status": status,
            "statusText": _status_text(status),
            "httpVersion": http_version,
            "cookies": [],
            "headers": response_headers,
            "content": {"size": bytes_in, "mimeType": str(record.get("mime") or UNKNOWN_MIME)},
            "redirectURL": location,
            "headersSize": -1,
            "bodySize": bytes_in,
        }
    entry: HarEntry = {
        "startedDateTime": _iso(started),
        "time": duration,
        "request": request,
        "response": response,
        "cache": {},
        "timings": {"send": 0, "wait": duration, "receive": 0},
    }
    ip = record.get("ip")
    if isinstance(ip, str) and ip:
        entry["serverIPAddress"] = ip.removeprefix("[").removesuffix("]")
    entry["_id"] = record.get("id")
    entry["_seq"] = record.get("seq")
    entry["_event"] = event
    entry["_decision"] = record.get("decision")
    entry["_rule"] = record.get("rule")
    entry["_reason"] = record.get("reason")
    entry["_action"] = record.get("action")
    entry["_sni"] = record.get("sni")
    source, actor, secret = record.get("action_source"), record.get("actor"), record.get("secret")
    if source is not None:
        entry["_action_source"] = source  # a command named its action
    if actor is not None:
        entry["_actor"] = actor  # a human's or a CDP connection's action, not the agent's
    if secret is not None:  # a block because of a brokered secret: its name, never its value
        entry["_secret"] = secret
        entry["_location"] = record.get("location")
        entry["_exfiltration"] = record.get("exfiltration") is True
    if event == "error":
        entry["_error"] = str(record.get("error") or "")
    return entry


def is_har_entry(record: AuditRecord) -> bool:
    """Whether :func:`to_har` makes an entry of this record: requests, blocks, and errors with a URL
    (a ``secret`` or ``secrets`` record is not an HTTP exchange: its request has its own record)."""
    event = record.get("event")
    return event in ("request", "block") or (event == "error" and bool(record.get("url")))


def to_har(records: Iterable[AuditRecord], *, creator_version: str) -> HarDocument:
    """A HAR 1.2 document of the requests in ``records``: :func:`har_chunks`, whole."""
    loaded: HarDocument = json.loads("".join(har_chunks(records, creator_version=creator_version)))
    return loaded


def har_chunks(records: Iterable[AuditRecord], *, creator_version: str) -> Iterator[str]:
    """A HAR 1.2 document of the requests in ``records``, as JSON text in pieces (one per entry):
    read one record at a time, so its memory does not grow with the log.

    Entries are in the order they started, within a window of :data:`HAR_WINDOW` (HAR prefers them
    sorted, and a record is written when its request ends, so only a request that outlasted that
    many later ones comes late). Blocked requests are entries with the proxy's refusal as their
    response; failed requests are entries with status 0 and the failure in ``_error``. Corral's own
    fields lead with an underscore, as HAR allows: ``_decision``, ``_rule``, ``_reason``,
    ``_action`` (and ``_action_source`` when a command named it, ``_actor`` when a human or a CDP
    connection acted), ``_seq``, ``_sni``, ``_id`` (the flow id) and ``_event``; a block because of
    a brokered secret adds ``_secret`` (its name), ``_location`` and ``_exfiltration``. Headers and
    URLs are as logged (redacted, placeholders never values, cut to the record's caps).
    """
    creator = json.dumps({"name": "corral", "version": creator_version})
    yield f'{{"log":{{"version":"{HAR_VERSION}","creator":{creator},"entries":['
    first = True
    for record in _in_start_order(record for record in records if is_har_entry(record)):
        yield ("" if first else ",") + json.dumps(_har_entry(record))
        first = False
    yield "]}}"


def _in_start_order(records: Iterable[AuditRecord], window: int = HAR_WINDOW) -> Iterator[AuditRecord]:
    heap: list[tuple[float, float, int, AuditRecord]] = []
    for order, record in enumerate(records):
        key = (_number(record.get("started"), _number(record.get("time"))), _number(record.get("seq")), order)
        heapq.heappush(heap, (*key, record))
        if len(heap) > window:
            yield heapq.heappop(heap)[3]
    while heap:
        yield heapq.heappop(heap)[3]


@dataclass(frozen=True, slots=True)
class HostSummary:
    """One host's traffic.

    ``requests``: requests that went upstream (decision ``allow`` or ``report``); ``blocked``:
    requests the proxy refused and CONNECTs it denied; ``reported``: records with decision
    ``report`` (what the policy would have refused, let through in report mode); ``errors``:
    failed requests and connections; ``bytes_in``/``bytes_out``: body bytes of the requests that
    went upstream (a refused request's bytes never left the sandbox, so they do not count).
    """

    host: str
    requests: int = 0
    blocked: int = 0
    reported: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


def summarize(records: Iterable[AuditRecord]) -> list[HostSummary]:
    """Per-host totals, sorted by host, in one pass; records without a host (``proxy``, ``policy``)
    are left out. Past the log's budget, the last ``tally`` record's counts are added (they are
    cumulative): requests, refusals and failures, without their bytes, which were not written."""
    counts: dict[str, dict[str, int]] = {}
    tally: list[Any] = []
    for record in records:
        if record.get("event") == "tally":
            rows = record.get("counts")
            tally = rows if isinstance(rows, list) else []
            continue
        host = record.get("host")
        if isinstance(host, str) and host:
            _add(counts, host, record.get("event"), record.get("decision"), 1, record)
    for row in tally:
        if isinstance(row, dict) and isinstance(row.get("host"), str) and row["host"]:
            _add(counts, row["host"], row.get("event"), row.get("decision"), max(0, _count(row.get("count"))), None)
    return [HostSummary(host, **counts[host]) for host in sorted(counts)]


def _add(
    counts: dict[str, dict[str, int]], host: str, event: Any, decision: Any, n: int, record: AuditRecord | None
) -> None:
    row = counts.setdefault(
        _canonical_host(host),
        {"requests": 0, "blocked": 0, "reported": 0, "errors": 0, "bytes_in": 0, "bytes_out": 0},
    )
    if event == "request":
        row["requests"] += n
        if record is not None:
            row["bytes_in"] += max(0, _count(record.get("bytes_in")))
            row["bytes_out"] += max(0, _count(record.get("bytes_out")))
    elif event == "block" or (event == "connect" and decision == "deny"):
        row["blocked"] += n
    elif event == "error":
        row["errors"] += n
    if decision == "report" and event != "secret":
        row["reported"] += n


def totals(summaries: Iterable[HostSummary], *, host: str = "total") -> HostSummary:
    """The sum of per-host summaries, under the name ``host``."""
    rows = list(summaries)
    return HostSummary(
        host,
        requests=sum(r.requests for r in rows),
        blocked=sum(r.blocked for r in rows),
        reported=sum(r.reported for r in rows),
        errors=sum(r.errors for r in rows),
        bytes_in=sum(r.bytes_in for r in rows),
        bytes_out=sum(r.bytes_out for r in rows),
    )


@dataclass(frozen=True, slots=True)
class SecretSummary:
    """One brokered secret's use with one host.

    ``substitutions``: values put in for placeholders (the ``count`` of ``secret`` records with rule
    ``secret-substitution``); ``reflections``: values scrubbed from answers (rule
    ``secret-reflection``); ``misuse``: requests refused for a placeholder or value headed where the
    secret is not bound (``block``, rule ``secret-misuse``), ``exfiltration`` of them flagged so;
    ``unavailable``: requests refused because the proxy did not hold the value (``block``, rule
    ``secret-unavailable``). ``secret`` is empty where a refusal named none.
    """

    host: str
    secret: str
    substitutions: int = 0
    reflections: int = 0
    misuse: int = 0
    exfiltration: int = 0
    unavailable: int = 0


def summarize_secrets(records: Iterable[AuditRecord]) -> list[SecretSummary]:
    """Per host and secret, sorted by both: what :class:`SecretSummary` counts; other records are left out."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for record in records:
        event, rule, host = record.get("event"), record.get("rule"), record.get("host")
        if not isinstance(host, str) or not host or not is_secret_record(record) or event == "secrets":
            continue
        name = record.get("secret")
        key = (_canonical_host(host), name if isinstance(name, str) else "")
        row = counts.setdefault(
            key, {"substitutions": 0, "reflections": 0, "misuse": 0, "exfiltration": 0, "unavailable": 0}
        )
        if event == "secret":
            uses = max(1, _count(record.get("count"), 1))  # a record is at least one use
            if rule == SUBSTITUTION:
                row["substitutions"] += uses
            elif rule == REFLECTION:
                row["reflections"] += uses
        elif rule == UNAVAILABLE:
            row["unavailable"] += 1
        elif rule != REFLECTION:  # a block naming a secret: misuse, whatever rule an older writer gave it
            row["misuse"] += 1
            if record.get("exfiltration") is True:
                row["exfiltration"] += 1
    return [SecretSummary(host, secret, **counts[host, secret]) for host, secret in sorted(counts)]
