"""Every audit record and log bounded (corral.proxy.audit: cap_fields, LogBudget, bounded_lines), and
reading one streamed (corral.proxy.traffic: har_chunks, summarize over tallies)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from corral.proxy.audit import (
    CHAIN_FIELDS,
    CUT_MARK,
    EVENT_FIELDS,
    MAX_HEADER_NAME_CHARS,
    MAX_HEADER_VALUE_CHARS,
    MAX_HEADERS,
    MAX_LINE_BYTES,
    MAX_TEXT_CHARS,
    MAX_URL_CHARS,
    TALLY_INTERVAL_S,
    AuditLog,
    LogBudget,
    bounded_lines,
    cap_fields,
    verify,
)
from corral.proxy.traffic import TrafficFilter, har_chunks, read_records, summarize, to_har


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _request(n: int, host: str = "allowed.test", **extra: Any) -> dict[str, Any]:
    return {
        "id": f"f{n}",
        "started": 100.0 + n,
        "method": "GET",
        "url": f"https://{host}/page/{n}",
        "host": host,
        "port": 443,
        "status": 200,
        "request_headers": [("accept", "*/*"), ("user-agent", "test")],
        "response_headers": [("content-type", "text/html")],
        "bytes_in": 10,
        "bytes_out": 0,
        "decision": "allow",
        **extra,
    }


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


# -- one record ------------------------------------------------------------------------------------


def test_a_megabyte_url_is_cut_with_a_mark_and_named_in_truncated() -> None:
    capped = cap_fields(_request(1, url="https://allowed.test/?q=" + "a" * (1 << 20)))
    assert len(capped["url"]) == MAX_URL_CHARS and capped["url"].endswith(CUT_MARK)
    assert capped["url"].startswith("https://allowed.test/?q=aaa")
    assert capped["truncated"] == ["url"]
    assert (capped["status"], capped["bytes_in"], capped["port"]) == (200, 10, 443)  # numbers stay


def test_huge_header_values_names_and_thousands_of_headers_are_cut_and_counted() -> None:
    headers = [("x-huge", "v" * 200_000), ("n" * 10_000, "short")] + [(f"x-{i}", str(i)) for i in range(5000)]
    capped = cap_fields(_request(1, request_headers=headers))
    pairs = [list(pair) for pair in capped["request_headers"]]
    assert len(pairs) == MAX_HEADERS + 1
    assert pairs[0] == ["x-huge", "v" * (MAX_HEADER_VALUE_CHARS - 1) + CUT_MARK]
    assert pairs[1][0] == "n" * (MAX_HEADER_NAME_CHARS - 1) + CUT_MARK
    assert pairs[-1] == [CUT_MARK, f"{len(headers) - MAX_HEADERS} more headers"]
    assert capped["truncated"] == ["request_headers"]
    assert capped["response_headers"] == [("content-type", "text/html")]  # nothing cut: kept as given


def test_every_other_attacker_text_is_cut_too_and_nothing_is_marked_when_nothing_was_cut() -> None:
    capped = cap_fields({"error": "e" * 10_000, "reason": "fine", "allow": ["x"] * 10_000})
    assert len(capped["error"]) == MAX_TEXT_CHARS and capped["error"].endswith(CUT_MARK)
    assert len(capped["allow"]) == 256
    assert capped["truncated"] == ["allow", "error"]
    plain = _request(2)
    assert "truncated" not in cap_fields(plain)


def test_a_capped_record_stays_below_the_line_bound_and_its_chain_verifies(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    log = AuditLog(log_path, "ses_x")
    worst = [("h" * 10_000, "\u2603" * 100_000)] * 10_000  # every char escaped by JSON: six bytes
    log.write("request", **_request(1, url="https://x.test/" + "\u2603" * (1 << 20), request_headers=worst))
    log.write("error", id="f2", url="u" * (1 << 20), host="x.test", error="boom" * 100_000)
    log.close()
    lines = log_path.read_bytes().splitlines()
    assert all(len(line) < MAX_LINE_BYTES for line in lines)
    records = _lines(log_path)
    assert records[0]["truncated"] == ["request_headers", "url"] and records[1]["truncated"] == ["error", "url"]
    for record in records:
        assert set(record) <= CHAIN_FIELDS | EVENT_FIELDS[record["event"]]
    assert verify(log_path).ok and verify(log_path).records == 2


# -- one log's budget ------------------------------------------------------------------------------


def test_past_the_budget_traffic_is_counted_after_one_marker_and_the_log_stops_growing(tmp_path: Path) -> None:
    clock = Clock()
    log_path = tmp_path / "audit.jsonl"
    log = AuditLog(log_path, "ses_x", max_bytes=20_000, clock=clock)
    for n in range(2000):
        log.write("request", **_request(n, host="a.test" if n % 2 else "b.test"))
    log.write("connect", host="c.test", port=443, decision="deny")
    size_before_close = log_path.stat().st_size
    assert log.budget is not None
    assert 20_000 <= size_before_close <= 20_000 + 2_000  # the record that crossed it, and the marker
    log.close()
    records = _lines(log_path)
    markers = [r for r in records if r["event"] == "budget"]
    assert len(markers) == 1 and markers[0]["max_bytes"] == 20_000
    written = sum(1 for r in records if r["event"] == "request")
    (tally,) = [r for r in records if r["event"] == "tally"]  # the final one, at close
    counts = {(row["host"], row["event"], row["decision"]): row["count"] for row in tally["counts"]}
    assert written + counts[("a.test", "request", "allow")] + counts[("b.test", "request", "allow")] == 2000
    assert counts[("c.test", "connect", "deny")] == 1 and tally["dropped"] == 2001 - written
    assert verify(log_path).ok
    # One pass summarises what was written and what was counted.
    rows = {row.host: row for row in summarize(read_records(log_path))}
    assert rows["a.test"].requests + rows["b.test"].requests == 2000 and rows["c.test"].blocked == 1


def test_tallies_come_when_the_head_is_asked_at_most_every_interval_and_are_chained(tmp_path: Path) -> None:
    clock = Clock()
    log_path = tmp_path / "audit.jsonl"
    log = AuditLog(log_path, "ses_x", max_bytes=16_384, clock=clock)
    for n in range(300):
        log.write("request", **_request(n))
    log.flush_tally()
    log.flush_tally()  # nothing new: none
    log.write("request", **_request(301))
    log.flush_tally()  # too soon
    clock.now += TALLY_INTERVAL_S
    log.flush_tally()
    log.flush_tally()
    log.close()  # nothing new since: no final one
    tallies = [r for r in _lines(log_path) if r["event"] == "tally"]
    assert len(tallies) == 2 and tallies[1]["dropped"] == tallies[0]["dropped"] + 1
    assert verify(log_path).ok


def test_the_session_s_own_changes_go_on_to_the_hard_limit_then_are_counted(tmp_path: Path) -> None:
    budget = LogBudget(100_000)
    assert budget.hard_limit == 100_000 + (32 << 10)
    budget.size = 100_000
    assert not budget.admits("request") and budget.admits("policy") and budget.admits("control")
    budget.size = budget.hard_limit
    assert not budget.admits("policy")
    with pytest.raises(ValueError):
        LogBudget(0)


def test_a_reopened_log_keeps_its_counts_and_writes_no_second_marker(tmp_path: Path) -> None:
    clock = Clock()
    log_path = tmp_path / "audit.jsonl"
    log = AuditLog(log_path, "ses_x", max_bytes=16_384, clock=clock)
    for n in range(200):
        log.write("request", **_request(n))
    log.close()
    first = [r for r in _lines(log_path) if r["event"] == "tally"][-1]["dropped"]
    again = AuditLog(log_path, "ses_x", max_bytes=16_384, clock=clock)  # a restarted proxy
    for n in range(10):
        again.write("request", **_request(n))
    again.close()
    records = _lines(log_path)
    assert sum(1 for r in records if r["event"] == "budget") == 1
    assert [r for r in records if r["event"] == "tally"][-1]["dropped"] == first + 10
    assert verify(log_path).ok


def test_a_tally_of_many_hosts_folds_the_rest_into_one_row() -> None:
    budget = LogBudget(1)
    for n in range(1000):
        budget.count("request", {"host": f"h{n}.test", "decision": "allow"})
    fields = budget.tally()
    assert len(fields["counts"]) <= 201 and fields["dropped"] == 1000
    assert sum(row["count"] for row in fields["counts"]) == 1000
    assert any(row["host"] == "*other*" for row in fields["counts"])


# -- reading -----------------------------------------------------------------------------------------


def test_bounded_lines_refuse_or_skip_a_line_longer_than_any_record_and_stop_at_a_size() -> None:
    data = b'{"a":1}\n' + b"x" * 100 + b"\n" + b'{"b":2}\n'
    with pytest.raises(ValueError, match="line 2: longer than 50 bytes"):
        list(bounded_lines(io.BytesIO(data), limit=50))
    assert list(bounded_lines(io.BytesIO(data), limit=50, lenient=True)) == [b'{"a":1}\n', b"\x00\n", b'{"b":2}\n']
    assert list(bounded_lines(io.BytesIO(data), size=8)) == [b'{"a":1}\n']


def test_verify_names_a_line_longer_than_any_record(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    log = AuditLog(log_path, "ses_x")
    log.write("request", **_request(1))
    log.close()
    with log_path.open("ab") as out:
        out.write(b"x" * (MAX_LINE_BYTES + 10) + b"\n")
    result = verify(log_path)
    assert (result.ok, result.first_bad, result.reason) == (False, 2, "longer than any audit record")


def test_har_written_in_pieces_is_one_valid_document_in_start_order() -> None:
    records: list[Any] = [
        {"seq": n, "time": 200.0 + n, "event": "request", **_request(n, started=100.0 + (n % 7))} for n in range(50)
    ]
    records.append({"seq": 51, "time": 300.0, "event": "policy", "allow": []})
    records.append({"seq": 52, "time": 301.0, "event": "error", "url": "https://x.test/", "error": "reset"})
    pieces = list(har_chunks(records, creator_version="9"))
    assert len(pieces) == 53  # the head, one per entry, the tail: never the whole document at once
    har = json.loads("".join(pieces))
    entries = har["log"]["entries"]
    assert har["log"]["version"] == "1.2" and har["log"]["creator"] == {"name": "corral", "version": "9"}
    assert len(entries) == 51
    starts = [e["startedDateTime"] for e in entries]
    assert starts == sorted(starts)
    assert json.loads("".join(har_chunks([], creator_version="9")))["log"]["entries"] == []
    assert to_har(records, creator_version="9") == har


def test_har_of_more_records_than_its_window_keeps_every_entry() -> None:
    records: list[Any] = [
        {"seq": n, "time": 1.0, "event": "request", **_request(n, started=float(5000 - n))} for n in range(1000)
    ]
    entries = to_har(records, creator_version="1")["log"]["entries"]
    assert sorted(e["_seq"] for e in entries) == list(range(1000))


def test_filters_keep_the_budget_records_apart() -> None:
    tally = {"seq": 9, "time": 1.0, "event": "tally", "counts": [], "dropped": 0}
    assert TrafficFilter(event="tally").matches(tally)  # type: ignore[arg-type]
    assert not TrafficFilter(host="allowed.test").matches(tally)  # type: ignore[arg-type]


def test_a_flood_of_the_session_s_own_changes_stops_at_the_hard_limit_with_a_marker(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    log = AuditLog(log_path, "ses_x", max_bytes=16_384, clock=Clock())
    for n in range(2000):
        log.write("control", change="requested", holder="agent", previous=f"human:{n}")
    assert log.budget is not None and log.budget.size <= log.budget.hard_limit + 1024
    log.close()
    records = _lines(log_path)
    assert [r["event"] for r in records].count("budget") == 1
    assert records[-1]["event"] == "tally" and records[-1]["counts"][0]["event"] == "control"
    assert verify(log_path).ok
