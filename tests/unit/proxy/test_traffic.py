from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft6Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT6

from corral.proxy.audit import AuditLog, verify
from corral.proxy.traffic import (
    HostSummary,
    SecretSummary,
    TrafficFilter,
    is_har_entry,
    is_secret_record,
    parse_records,
    parse_time,
    read_records,
    summarize,
    summarize_secrets,
    to_har,
    totals,
)

SCHEMA_DIR = Path(__file__).parent / "har_schema"
T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z


def _har_validator() -> Draft6Validator:
    resources = []
    for path in sorted(SCHEMA_DIR.glob("*.json")):
        contents = json.loads(path.read_text())
        resources.append((contents["$id"].removesuffix("#"), Resource.from_contents(contents, DRAFT6)))
    registry: Registry[Any] = Registry().with_resources(resources)
    schema = json.loads((SCHEMA_DIR / "har.json").read_text())
    # The format checker matters: serverIPAddress is oneOf ipv4/ipv6 formats, which only a checker tells apart.
    return Draft6Validator(schema, registry=registry, format_checker=Draft6Validator.FORMAT_CHECKER)


HAR = _har_validator()


def _assert_valid_har(har: dict[str, Any]) -> None:
    errors = sorted(HAR.iter_errors(har), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    for entry in har["log"]["entries"]:
        started = dt.datetime.fromisoformat(entry["startedDateTime"])
        assert started.tzinfo is not None
        assert entry["time"] >= 0
        assert set(entry["timings"]) >= {"send", "wait", "receive"}
        assert all(value >= 0 for value in entry["timings"].values())


def _request(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "id": "flow-1",
        "started": T0 + 1.5,
        "method": "GET",
        "url": "https://example.com/search?q=cats&token=[redacted]&empty=",
        "scheme": "https",
        "host": "example.com",
        "port": 443,
        "ip": "93.184.216.34",
        "sni": "example.com",
        "http_version": "HTTP/1.1",
        "status": 200,
        "request_headers": [["Host", "example.com"], ["Cookie", "[redacted]"]],
        "response_headers": [["Content-Type", "text/html"], ["Content-Length", "1024"]],
        "mime": "text/html",
        "bytes_out": 0,
        "bytes_in": 1024,
        "duration_ms": 85.25,
        "decision": "allow",
        "rule": "example.com",
        "reason": "allowed by example.com",
        "action": "act_1",
    }
    fields.update(overrides)
    return fields


def _block(**overrides: Any) -> dict[str, Any]:
    fields = _request(
        id="flow-2",
        started=T0 + 2,
        method="POST",
        url="https://example.com/admin",
        ip=None,
        status=403,
        response_headers=[["Content-Type", "text/plain"]],
        mime="text/plain",
        bytes_out=12,
        bytes_in=40,
        duration_ms=0.5,
        decision="deny",
        rule=None,
        reason="POST example.com/admin is not allowed",
    )
    fields.update(overrides)
    return fields


def _error(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "id": "flow-3",
        "method": "GET",
        "url": "https://slow.example.org/",
        "host": "slow.example.org",
        "port": 443,
        "ip": None,
        "error": "upstream timed out",
        "action": "act_2",
        "decision": "allow",
        "duration_ms": 30000.0,
    }
    fields.update(overrides)
    return fields


def _write_session(path: Path) -> list[dict[str, Any]]:
    """A session: proxy start, a tunnel and its requests, a block, a denied tunnel, an error, a policy change."""
    log = AuditLog(path, "ses_abc")
    records: list[dict[str, Any]] = []

    def write(event: str, **fields: Any) -> None:
        # Record n gets time T0 + n - 1 (a field named like a common one overrides it, chain and all).
        records.append(log.write(event, time=T0 + len(records), **fields))

    write("proxy", version="0.1.0", mode="enforce")
    write(
        "connect",
        host="example.com",
        port=443,
        client="10.0.0.2",
        action="act_1",
        decision="allow",
        rule="example.com",
        reason="allowed",
    )
    write("request", **_request())
    write("request", **_request(id="flow-4", url="https://api.example.com/v1", host="api.example.com", bytes_out=7))
    write("block", **_block())
    write(
        "connect",
        host="evil.test",
        port=443,
        client="10.0.0.2",
        action="act_2",
        decision="deny",
        rule=None,
        reason="not in the allowlist",
    )
    write("error", **_error())
    write(
        "connect",
        host="tracker.test",
        port=443,
        client="10.0.0.2",
        action=None,
        decision="report",
        rule=None,
        reason="would be denied",
    )
    write(
        "request",
        **_request(
            id="flow-5",
            started=T0 + 8,
            url="https://tracker.test/p",
            host="tracker.test",
            decision="report",
            action=None,
        ),
    )
    write("policy", allow=["example.com", "*.example.com"], mode="enforce", previous_allow=None, previous_mode=None)
    log.close()
    return records


# --- reading ---------------------------------------------------------------------------------------------------


def test_read_records_reads_what_the_audit_log_wrote(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    written = _write_session(path)
    assert verify(path).ok
    assert list(read_records(path)) == written


def test_read_records_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('\n{"seq": 1}\n   \n\n{"seq": 2}\n')
    assert [r["seq"] for r in read_records(path)] == [1, 2]


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ('{"seq": 1}\n{"seq": 2\n', 2, "not valid JSON"),
        ('{"seq": 1}\n\n\n[1, 2]\n', 4, "not a JSON object"),
        ('"just a string"\n', 1, "not a JSON object"),
        ('{"seq": 1}\nnull\n', 2, "not a JSON object"),
    ],
)
def test_a_malformed_line_is_named(tmp_path: Path, text: str, line: int, why: str) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"line {line}: .*{why}") as info:
        list(read_records(path))
    assert str(path) in str(info.value)


def test_invalid_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"seq": 1}\n{"url": "\xff"}\n')
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        list(read_records(path))


def test_parse_records_names_its_source() -> None:
    with pytest.raises(ValueError, match=r"^session ses_1: line 1: not valid JSON"):
        list(parse_records(["{oops"], source="session ses_1"))
    assert list(parse_records([b'{"a": 1}', "", '{"b": 2}'])) == [{"a": 1}, {"b": 2}]


# --- times and filters -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1714564800", T0),
        ("1714564800.25", T0 + 0.25),
        (T0, T0),
        (1714564800, T0),
        ("2024-05-01T12:00:00Z", T0),
        ("2024-05-01T12:00:00+00:00", T0),
        ("2024-05-01T14:00:00+02:00", T0),
        ("2024-05-01T12:00:00", T0),  # no zone: UTC
        ("2024-05-01 12:00:00.500", T0 + 0.5),
        ("2024-05-01", T0 - 12 * 3600),
    ],
)
def test_parse_time(text: str | float, seconds: float) -> None:
    assert parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["yesterday", "", "2024-13-01", "nan", "inf", "12:00:00Z"])
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text)


@pytest.fixture
def session(tmp_path: Path) -> list[dict[str, Any]]:
    return _write_session(tmp_path / "audit.jsonl")


def _seqs(records: list[dict[str, Any]], flt: TrafficFilter) -> list[int]:
    return [r["seq"] for r in flt.apply(records)]


@pytest.mark.parametrize(
    ("kwargs", "seqs"),
    [
        ({}, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
        ({"host": "example.com"}, [2, 3, 5]),
        ({"host": "EXAMPLE.com."}, [2, 3, 5]),
        ({"host": "*.example.com"}, [4]),  # subdomains, not the apex
        ({"host": "*.example.org"}, [7]),
        ({"host": "example.org"}, []),
        ({"host": "evil.test"}, [6]),
        ({"decision": "deny"}, [5, 6]),
        ({"decision": "DENY"}, [5, 6]),
        ({"decision": "report"}, [8, 9]),
        ({"decision": "allow"}, [2, 3, 4, 7]),
        ({"event": "request"}, [3, 4, 9]),
        ({"event": "connect"}, [2, 6, 8]),
        ({"event": "proxy"}, [1]),
        ({"event": "policy"}, [10]),
        ({"event": "error"}, [7]),
        ({"action": "act_1"}, [2, 3, 4, 5]),
        ({"action": "act_2"}, [6, 7]),
        ({"since": str(T0 + 5)}, [6, 7, 8, 9, 10]),  # record n has time T0 + n - 1
        ({"until": str(T0 + 1)}, [1, 2]),
        ({"since": "2024-05-01T12:00:02Z", "until": "2024-05-01T12:00:04Z"}, [3, 4, 5]),
        ({"since": T0 + 3, "until": T0 + 3}, [4]),
        ({"event": "request", "decision": "allow", "host": "*.example.com"}, [4]),
        ({"event": "block", "action": "act_2"}, []),
    ],
)
def test_filters(session: list[dict[str, Any]], kwargs: dict[str, Any], seqs: list[int]) -> None:
    assert _seqs(session, TrafficFilter.parse(**kwargs)) == seqs


def test_filter_constructed_directly_is_canonical(session: list[dict[str, Any]]) -> None:
    flt = TrafficFilter(host="Example.COM", since=T0)
    assert flt.host == "example.com"
    assert _seqs(session, flt) == [2, 3, 5]
    assert TrafficFilter(host="*.EXAMPLE.com").host == "*.example.com"


def test_filter_matches_ip_hosts_in_any_spelling() -> None:
    record = {"event": "connect", "host": "127.0.0.1", "time": T0}
    assert TrafficFilter.parse(host="2130706433").matches(record)
    assert TrafficFilter.parse(host="[::1]").matches({"host": "::1"})


def test_a_filter_on_a_field_skips_records_without_it() -> None:
    assert not TrafficFilter(host="example.com").matches({"event": "proxy"})
    assert not TrafficFilter(since=T0).matches({"event": "request"})
    assert not TrafficFilter(action="act_1").matches({"event": "request", "action": None})
    assert TrafficFilter().matches({})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"decision": "maybe"}, "decision must be one of allow, deny, report, not 'maybe'"),
        (
            {"event": "requests"},
            "event must be one of block, budget, connect, control, download, error, lifetime, link, policy, preview, "
            "profile, proxy, request",
        ),
        ({"since": "tomorrow"}, "since: not unix seconds or an ISO 8601 time: 'tomorrow'"),
        ({"until": "nan"}, "until: not a finite number"),
        ({"since": "2024-05-02", "until": "2024-05-01"}, "since (2024-05-02T00:00:00.000Z) is after until"),
        ({"host": "exa mple.com"}, "host: not a valid host name"),
        ({"host": "*.*.example.com"}, "host: a wildcard may only lead a host"),
        ({"host": "ex*ample.com"}, "host: a wildcard may only lead a host"),
        ({"host": "*.10.0.0.1"}, "host: a wildcard needs a domain"),
        ({"host": ""}, "host: empty host"),
        ({"action": "  "}, "action must not be empty"),
    ],
)
def test_bad_filters_are_refused_clearly(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        TrafficFilter.parse(**kwargs)
    assert message in str(info.value)


def test_bad_filters_constructed_directly() -> None:
    with pytest.raises(ValueError, match="since must be a finite number"):
        TrafficFilter(since=float("inf"))
    with pytest.raises(ValueError, match="is after until"):
        TrafficFilter(since=2.0, until=1.0)
    with pytest.raises(ValueError, match="decision must be one of"):
        TrafficFilter(decision="Deny")  # parse() accepts any case; the dataclass wants the canonical value


# --- HAR -------------------------------------------------------------------------------------------------------


def test_har_of_a_whole_session_is_valid(session: list[dict[str, Any]]) -> None:
    har = to_har(session, creator_version="0.1.0")
    _assert_valid_har(har)
    log = har["log"]
    assert log["version"] == "1.2"
    assert log["creator"] == {"name": "corral", "version": "0.1.0"}
    # requests, the block and the error with a URL, by start time; not connects, proxy or policy records
    assert [e["_seq"] for e in log["entries"]] == [3, 4, 5, 7, 9]
    assert json.loads(json.dumps(har)) == har


def test_har_request_entry_maps_every_field() -> None:
    record = {"seq": 3, "time": T0 + 2, "session": "ses_abc", "event": "request", **_request()}
    har = to_har([record], creator_version="9")
    _assert_valid_har(har)
    (entry,) = har["log"]["entries"]
    assert entry == {
        "startedDateTime": "2024-05-01T12:00:01.500Z",
        "time": 85.25,
        "request": {
            "method": "GET",
            "url": "https://example.com/search?q=cats&token=[redacted]&empty=",
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": [{"name": "Host", "value": "example.com"}, {"name": "Cookie", "value": "[redacted]"}],
            "queryString": [
                {"name": "q", "value": "cats"},
                {"name": "token", "value": "[redacted]"},
                {"name": "empty", "value": ""},
            ],
            "headersSize": -1,
            "bodySize": 0,
        },
        "response": {
            "status": 200,
            "statusText": "OK",
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": [
                {"name": "Content-Type", "value": "text/html"},
                {"name": "Content-Length", "value": "1024"},
            ],
            "content": {"size": 1024, "mimeType": "text/html"},
            "redirectURL": "",
            "headersSize": -1,
            "bodySize": 1024,
        },
        "cache": {},
        "timings": {"send": 0, "wait": 85.25, "receive": 0},
        "serverIPAddress": "93.184.216.34",
        "_id": "flow-1",
        "_seq": 3,
        "_event": "request",
        "_decision": "allow",
        "_rule": "example.com",
        "_reason": "allowed by example.com",
        "_action": "act_1",
        "_sni": "example.com",
    }


@pytest.mark.parametrize(
    ("overrides", "check"),
    [
        (
            {"status": 302, "response_headers": [["location", "https://example.com/next"]]},
            ("redirect", "https://example.com/next"),
        ),
        ({"status": 599}, ("statusText", "")),
        ({"status": 418}, ("statusText", "I'm a Teapot")),
        ({"status": 421}, ("statusText", "Misdirected Request")),
        ({"mime": None}, ("mimeType", "x-unknown")),
        ({"ip": "2606:2800:220:1:248:1893:25c8:1946"}, ("ip", "2606:2800:220:1:248:1893:25c8:1946")),
        ({"ip": None}, ("ip", None)),
        ({"url": "https://example.com/"}, ("query", [])),
        ({"url": "https://example.com/?a=1&a=2&b=%20x"}, ("query", [("a", "1"), ("a", "2"), ("b", " x")])),
        ({"started": None}, ("started", "2024-05-01T12:00:09.000Z")),  # falls back to the record's time
        ({"duration_ms": -3.0}, ("time", 0.0)),
        ({"http_version": "HTTP/2.0"}, ("version", "HTTP/2.0")),
    ],
)
def test_har_request_entry_variants(overrides: dict[str, Any], check: tuple[str, Any]) -> None:
    record = {"seq": 1, "time": T0 + 9, "session": "s", "event": "request", **_request(**overrides)}
    har = to_har([record], creator_version="1")
    _assert_valid_har(har)
    (entry,) = har["log"]["entries"]
    what, expected = check
    actual = {
        "redirect": lambda: entry["response"]["redirectURL"],
        "statusText": lambda: entry["response"]["statusText"],
        "mimeType": lambda: entry["response"]["content"]["mimeType"],
        "ip": lambda: entry.get("serverIPAddress"),
        "query": lambda: [(q["name"], q["value"]) for q in entry["request"]["queryString"]],
        "started": lambda: entry["startedDateTime"],
        "time": lambda: (entry["time"], entry["timings"]["wait"])[0],
        "version": lambda: (entry["request"]["httpVersion"], entry["response"]["httpVersion"]),
    }[what]()
    if what == "version":
        expected = (expected, expected)
    assert actual == expected


def test_har_block_entry_is_the_refusal() -> None:
    record = {"seq": 5, "time": T0 + 4, "session": "s", "event": "block", **_block()}
    har = to_har([record], creator_version="1")
    _assert_valid_har(har)
    (entry,) = har["log"]["entries"]
    assert entry["response"]["status"] == 403
    assert entry["response"]["statusText"] == "Forbidden"
    assert entry["response"]["content"] == {"size": 40, "mimeType": "text/plain"}
    assert entry["request"]["bodySize"] == 12
    assert "serverIPAddress" not in entry
    assert (entry["_event"], entry["_decision"], entry["_rule"]) == ("block", "deny", None)
    assert entry["_reason"] == "POST example.com/admin is not allowed"


def test_har_error_entry_has_status_zero_and_the_error() -> None:
    record = {"seq": 7, "time": T0 + 6, "session": "s", "event": "error", **_error()}
    har = to_har([record], creator_version="1")
    _assert_valid_har(har)
    (entry,) = har["log"]["entries"]
    assert entry["startedDateTime"] == "2024-05-01T12:00:06.000Z"  # no started: the record's time
    assert entry["time"] == 30000.0
    assert entry["request"]["method"] == "GET"
    assert entry["request"]["url"] == "https://slow.example.org/"
    assert entry["request"]["bodySize"] == -1
    assert entry["response"]["status"] == 0
    assert entry["response"]["statusText"] == ""
    assert entry["response"]["bodySize"] == -1
    assert entry["_error"] == "upstream timed out"
    assert entry["_action"] == "act_2"


def test_har_entries_say_when_a_command_named_the_action() -> None:
    named = {"seq": 1, "time": T0, "session": "s", "event": "request", **_request(action_source="command")}
    theirs = {"seq": 2, "time": T0 + 1, "session": "s", "event": "request", **_request()}
    har = to_har([named, theirs], creator_version="1")
    _assert_valid_har(har)
    first, second = har["log"]["entries"]
    assert (first["_action"], first["_action_source"]) == (named["action"], "command")
    assert "_action_source" not in second  # the controller's action in flight, as before


@pytest.mark.parametrize(
    ("record", "entry"),
    [
        ({"event": "request"}, True),
        ({"event": "block"}, True),
        ({"event": "error", "url": "https://x.test/"}, True),
        ({"event": "error", "url": None, "host": "x.test"}, False),  # a failed tunnel: no request to show
        ({"event": "error"}, False),
        ({"event": "connect"}, False),
        ({"event": "proxy"}, False),
        ({"event": "policy"}, False),
    ],
)
def test_which_records_become_entries(record: dict[str, Any], entry: bool) -> None:
    assert is_har_entry(record) is entry
    assert len(to_har([record], creator_version="1")["log"]["entries"]) == int(entry)


def test_har_tolerates_sparse_records() -> None:
    """Records with only some fields (older proxies, hand-made logs) still make valid HAR."""
    records = [
        {"seq": 1, "time": T0, "event": "request", "url": "https://example.test/0", "status": 200},
        {"seq": 2, "time": T0 + 1, "event": "block"},
        {"seq": 3, "event": "error", "url": "https://example.test/1", "error": None},
    ]
    har = to_har(records, creator_version="1")
    _assert_valid_har(har)
    assert [e["_seq"] for e in har["log"]["entries"]] == [3, 1, 2]  # no time at all sorts first (epoch)


def test_har_of_nothing() -> None:
    har = to_har([], creator_version="1")
    _assert_valid_har(har)
    assert har["log"]["entries"] == []


def test_har_schema_is_really_checked() -> None:
    """The vendored schema does catch broken output (so the passing tests above mean something)."""
    record = {"seq": 1, "time": T0, "event": "request", **_request()}
    har = to_har([record], creator_version="1")
    broken = json.loads(json.dumps(har))
    del broken["log"]["entries"][0]["response"]["content"]["mimeType"]
    assert any("mimeType" in e.message for e in HAR.iter_errors(broken))
    broken = json.loads(json.dumps(har))
    broken["log"]["entries"][0]["startedDateTime"] = "2024-05-01T12:00:00"  # no zone
    assert list(HAR.iter_errors(broken))
    broken = json.loads(json.dumps(har))
    broken["log"]["entries"][0]["serverIPAddress"] = "not-an-ip"
    assert list(HAR.iter_errors(broken))


# --- summary ---------------------------------------------------------------------------------------------------


def test_summarize_a_session(session: list[dict[str, Any]]) -> None:
    rows = summarize(session)
    assert rows == [
        HostSummary("api.example.com", requests=1, bytes_in=1024, bytes_out=7),
        HostSummary("evil.test", blocked=1),
        HostSummary("example.com", requests=1, blocked=1, bytes_in=1024, bytes_out=0),
        HostSummary("slow.example.org", errors=1),
        HostSummary("tracker.test", requests=1, reported=2, bytes_in=1024),
    ]
    assert totals(rows) == HostSummary("total", requests=3, blocked=2, reported=2, errors=1, bytes_in=3072, bytes_out=7)


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], []),
        ([{"event": "proxy"}, {"event": "policy", "allow": []}], []),
        (
            [{"event": "connect", "host": "a.test", "decision": "allow"}],
            [HostSummary("a.test")],
        ),
        (
            [{"event": "connect", "host": "a.test", "decision": "deny"}, {"event": "block", "host": "a.test"}],
            [HostSummary("a.test", blocked=2)],
        ),
        (  # a refused request's bytes never left: not counted
            [{"event": "block", "host": "a.test", "decision": "deny", "bytes_in": 40, "bytes_out": 9}],
            [HostSummary("a.test", blocked=1)],
        ),
        (
            [
                {"event": "request", "host": "A.test", "bytes_in": 5, "bytes_out": 1, "decision": "allow"},
                {"event": "request", "host": "a.test.", "bytes_in": 6, "bytes_out": 2, "decision": "report"},
            ],
            [HostSummary("a.test", requests=2, reported=1, bytes_in=11, bytes_out=3)],
        ),
        (
            [{"event": "error", "host": "b.test", "decision": "allow"}, {"event": "error", "host": "a.test"}],
            [HostSummary("a.test", errors=1), HostSummary("b.test", errors=1)],
        ),
        (  # junk byte counts are not counted
            [{"event": "request", "host": "a.test", "bytes_in": "9", "bytes_out": None}],
            [HostSummary("a.test", requests=1)],
        ),
    ],
)
def test_summarize_counts(records: list[dict[str, Any]], expected: list[HostSummary]) -> None:
    assert summarize(records) == expected


def test_totals_of_nothing() -> None:
    assert totals([]) == HostSummary("total")
    assert totals([], host="all").host == "all"


# --- brokered secrets ------------------------------------------------------------------------------------------
# Hand-written records in the shapes the proxy writes (audit.EVENT_FIELDS: secrets, secret, a block's secret fields).


def _secret_use(rule: str, **overrides: Any) -> dict[str, Any]:
    return {
        "event": "secret",
        "id": "flow-s",
        "method": "POST",
        "url": "https://api.example.test/v1/items",
        "host": "api.example.test",
        "port": 443,
        "action": "a1.b",
        "rule": rule,
        "secret": "GITHUB_TOKEN",
        "location": "header",
        "count": 1,
        **overrides,
    }


def _requested(**overrides: Any) -> dict[str, Any]:
    return {"event": "request", **_request(**overrides)}


def _blocked(**overrides: Any) -> dict[str, Any]:
    return {"event": "block", **_block(**overrides)}


def _misuse(**overrides: Any) -> dict[str, Any]:
    return _blocked(
        **{
            "url": "https://evil.test/collect",
            "host": "evil.test",
            "rule": "secret-misuse",
            "reason": "GITHUB_TOKEN is not bound to evil.test",
            "secret": "GITHUB_TOKEN",
            "location": "body",
            "exfiltration": True,
            **overrides,
        }
    )


SECRETS_CHANGE = {
    "event": "secrets",
    "actor": "api-key:k1",
    "generation": 1,
    "added": ["GITHUB_TOKEN"],
    "rotated": [],
    "revoked": [],
    "restored": [],
    "bindings": {"GITHUB_TOKEN": {"allow": ["GET,POST api.example.test/v1/"], "in": ["header"]}},
}


def test_summarize_secrets_per_host_and_secret() -> None:
    records: list[dict[str, Any]] = [
        SECRETS_CHANGE,
        _requested(host="api.example.test"),
        _secret_use("secret-substitution", count=2),
        _secret_use("secret-substitution", location="query"),  # another location of the same request
        _secret_use("secret-substitution", secret="NPM_TOKEN", host="API.example.test."),
        _secret_use("secret-reflection", location="response-body", count=3),
        _misuse(),
        _misuse(location="websocket"),
        _misuse(secret="NPM_TOKEN", exfiltration=False),  # an older writer's block: misuse all the same
        _blocked(host="api.example.test", rule="secret-unavailable", status=503, secret="GITHUB_TOKEN"),
        _blocked(host="api.example.test", rule="secret-unavailable", status=503),  # naming no secret
        _blocked(host="evil.test", rule="default-deny"),  # not about a secret
        _blocked(host="api.example.test", rule="secret-reflection", status=502),  # an answer not decodable: no use
    ]
    assert summarize_secrets(records) == [
        SecretSummary("api.example.test", "", unavailable=1),
        SecretSummary("api.example.test", "GITHUB_TOKEN", substitutions=3, reflections=3, unavailable=1),
        SecretSummary("api.example.test", "NPM_TOKEN", substitutions=1),
        SecretSummary("evil.test", "GITHUB_TOKEN", misuse=2, exfiltration=2),
        SecretSummary("evil.test", "NPM_TOKEN", misuse=1),
    ]
    # The per-host traffic summary is unchanged by the secret records: a block is still one block.
    assert [(row.host, row.requests, row.blocked) for row in summarize(records)] == [
        ("api.example.test", 1, 3),
        ("evil.test", 0, 4),
    ]


@pytest.mark.parametrize(
    "record",
    [
        _secret_use("secret-substitution", count=None),
        _secret_use("secret-substitution", count="7"),
        _secret_use("secret-substitution", count=0),
        _secret_use("secret-substitution", count=True),
    ],
)
def test_a_secret_record_with_a_junk_count_is_one_use(record: dict[str, Any]) -> None:
    assert summarize_secrets([record]) == [SecretSummary("api.example.test", "GITHUB_TOKEN", substitutions=1)]


def test_summarize_secrets_of_a_log_without_them(session: list[dict[str, Any]]) -> None:
    assert summarize_secrets(session) == []
    assert summarize_secrets([SECRETS_CHANGE, _secret_use("secret-substitution", host=None)]) == []


@pytest.mark.parametrize(
    ("record", "about_secrets"),
    [
        (SECRETS_CHANGE, True),
        (_secret_use("secret-reflection"), True),
        (_misuse(), True),
        (_blocked(rule="secret-unavailable"), True),
        (_blocked(rule="secret-reflection", status=502), True),
        (_blocked(rule="default-deny"), False),
        (_requested(), False),
        ({"event": "policy", "allow": []}, False),
        ({"event": "error", "secret": "X"}, False),  # only blocks carry a secret's name
    ],
)
def test_the_secrets_filter(record: dict[str, Any], about_secrets: bool) -> None:
    assert is_secret_record(record) is about_secrets
    assert TrafficFilter(secrets=True).matches(record) is about_secrets
    assert TrafficFilter.parse(secrets=True).matches(record) is about_secrets
    assert TrafficFilter().matches(record)


def test_the_secrets_filter_combines_with_the_others() -> None:
    records = [SECRETS_CHANGE, _secret_use("secret-substitution"), _misuse(), _requested(host="evil.test")]
    kept = list(TrafficFilter(secrets=True, host="evil.test").apply(records))
    assert kept == [records[2]]


def test_har_leaves_out_secret_records_and_names_the_secret_of_a_misuse_block() -> None:
    records = [SECRETS_CHANGE, _requested(), _secret_use("secret-substitution"), _misuse()]
    assert [is_har_entry(r) for r in records] == [False, True, False, True]
    har = to_har(records, creator_version="1.0")
    _assert_valid_har(har)
    request_entry, block_entry = har["log"]["entries"]
    assert "_secret" not in request_entry
    assert block_entry["_rule"] == "secret-misuse"
    assert (block_entry["_secret"], block_entry["_location"], block_entry["_exfiltration"]) == (
        "GITHUB_TOKEN",
        "body",
        True,
    )
    unavailable = to_har(
        [_blocked(rule="secret-unavailable", secret="GITHUB_TOKEN", location="header")], creator_version="1"
    )
    assert unavailable["log"]["entries"][0]["_exfiltration"] is False


def test_har_entries_name_a_human_s_or_cdp_s_actor() -> None:
    human = {"seq": 1, "time": T0, "session": "s", "event": "request", **_request(actor="human:lnk_3kq9x0a1b2c4")}
    agent = {"seq": 2, "time": T0 + 1, "session": "s", "event": "request", **_request()}
    har = to_har([human, agent], creator_version="1")
    _assert_valid_har(har)
    first, second = har["log"]["entries"]
    assert first["_actor"] == "human:lnk_3kq9x0a1b2c4"
    assert "_actor" not in second  # the agent's, as before
