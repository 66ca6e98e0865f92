from __future__ import annotations

import ast
import itertools
import json
import re
import typing
from pathlib import Path

import pytest

from corral.proxy.audit import GENESIS, REDACTED, AuditLog, redact_headers, redact_url, verify


def _log(path: Path, n: int = 5) -> list[dict[str, object]]:
    log = AuditLog(path, "ses_1")
    records = [log.write("request", url=f"https://example.test/{i}", status=200, action_id=f"a{i}") for i in range(n)]
    log.close()
    return records


def test_records_chain_and_verify(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    records = _log(path)
    assert records[0]["prev"] == GENESIS
    assert all(b["prev"] == a["hash"] for a, b in itertools.pairwise(records))
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5]
    result = verify(path)
    assert result.ok and result.records == 5 and result.first_bad is None


def test_reopening_continues_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    first = _log(path, 2)
    again = AuditLog(path, "ses_1")
    record = again.write("block", host="other.invalid")
    again.close()
    assert record["seq"] == 3 and record["prev"] == first[-1]["hash"]
    assert verify(path).ok


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.mark.parametrize(
    ("tamper", "first_bad"),
    [
        (lambda lines: [*lines[:2], lines[2].replace('"status":200', '"status":403'), *lines[3:]], 3),  # edited
        (lambda lines: lines[:1] + lines[2:], 2),  # removed
        (lambda lines: [lines[0], lines[2], lines[1], *lines[3:]], 2),  # reordered
        (lambda lines: [*lines[:3], lines[3], *lines[3:]], 5),  # duplicated
        (lambda lines: [*lines[:4], "{not json"], 5),  # garbage
    ],
)
def test_tampering_is_found_at_the_right_record(tmp_path: Path, tamper: object, first_bad: int) -> None:
    path = tmp_path / "audit.jsonl"
    _log(path)
    path.write_text("\n".join(tamper(_lines(path))) + "\n")  # type: ignore[operator]
    result = verify(path)
    assert result.ok is False
    assert result.first_bad == first_bad
    assert result.reason


def test_rewriting_a_record_with_a_fresh_hash_still_breaks_the_next_link(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "audit.jsonl"
    _log(path)
    lines = _lines(path)
    record = json.loads(lines[1])
    record["url"] = "https://innocent.test/"
    body = {k: v for k, v in record.items() if k != "hash"}
    record["hash"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    lines[1] = json.dumps(record, sort_keys=True, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")
    result = verify(path)
    assert result.ok is False and result.first_bad == 3


def test_secret_headers_are_redacted() -> None:
    headers = [
        ("Authorization", "Bearer x"),
        ("Cookie", "a=b"),
        ("Set-Cookie", "c=d"),
        ("X-Api-Key", "k"),
        ("Proxy-Authorization", "Basic y"),
        ("Accept", "text/html"),
    ]
    assert redact_headers(headers) == [
        ("Authorization", REDACTED),
        ("Cookie", REDACTED),
        ("Set-Cookie", REDACTED),
        ("X-Api-Key", REDACTED),
        ("Proxy-Authorization", REDACTED),
        ("Accept", "text/html"),
    ]


@pytest.mark.parametrize(
    ("url", "kept", "gone"),
    [
        ("https://example.test/a?q=cats&api_key=SECRET", "q=cats", "SECRET"),
        ("https://example.test/a?access_token=SECRET&page=2", "page=2", "SECRET"),
        ("https://example.test/a?sig=SECRET", "sig=", "SECRET"),
        ("https://user:SECRET@example.test/", "example.test", "SECRET"),
        ("https://example.test/plain", "/plain", "SECRET"),
    ],
)
def test_query_secrets_are_redacted(url: str, kept: str, gone: str) -> None:
    redacted = redact_url(url)
    assert kept in redacted and gone not in redacted


def test_redaction_catches_camel_case_and_token_headers() -> None:
    from corral.proxy.audit import redact_headers, redact_url

    url = redact_url("https://x.test/p?accessToken=a&apikey=b&sessionid=c&q=1&zipcode=9&api_key=d")
    assert "=a" not in url and "=b" not in url and "=c" not in url and "=d" not in url
    assert "q=1" in url and "zipcode=9" in url
    headers = dict(
        redact_headers([("PRIVATE-TOKEN", "t"), ("X-CSRF-Token", "c"), ("X-Api-Token", "a"), ("Accept", "text/html")])
    )
    assert headers == {
        "PRIVATE-TOKEN": "[redacted]",
        "X-CSRF-Token": "[redacted]",
        "X-Api-Token": "[redacted]",
        "Accept": "text/html",
    }


def test_a_torn_last_line_is_kept_for_verify_and_the_chain_goes_on(tmp_path) -> None:
    from corral.proxy.audit import AuditLog, verify

    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, "ses_1")
    log.write("proxy")
    log.write("request", status=200)
    log.close()
    with path.open("ab") as raw:
        raw.write(b'{"seq":3,"half')  # a write cut short
    again = AuditLog(path, "ses_1")
    record = again.write("request", status=204)
    again.close()
    lines = path.read_bytes().splitlines()
    assert lines[2] == b'{"seq":3,"half'
    assert b'"event":"recovered"' in lines[3] and record["seq"] == 4
    result = verify(path)
    assert not result.ok and result.first_bad == 3  # the damage stays visible


# -- anchors ----------------------------------------------------------------------------------------

KEY = b"k" * 32


def _chain(path, session: str = "ses_1", count: int = 6, tag: str = "") -> list[dict]:
    from corral.proxy.audit import AuditLog

    log = AuditLog(path, session)
    written = [log.write("request", url=f"https://example.test/{tag}{i}", status=200) for i in range(count)]
    log.close()
    return written


def _anchors(written: list[dict], *seqs: int, session: str = "ses_1") -> list[dict]:
    from corral.proxy.audit import make_anchor, parse_anchors

    made = [make_anchor(KEY, session, seq, written[seq - 1]["hash"], "poll") for seq in seqs]
    lines = [json.dumps(anchor).encode() for anchor in made]
    return parse_anchors(lines, KEY)  # as `corral audit verify --key` reads them


def test_anchors_prove_the_anchored_records_and_say_what_comes_after(tmp_path) -> None:
    from corral.proxy.audit import verify_anchored

    path = tmp_path / "audit.jsonl"
    written = _chain(path)
    result = verify_anchored(path, _anchors(written, 2, 4))
    assert (result.status, result.ok, result.proven, result.unproven) == ("intact", True, 4, 2)
    assert "records 1-4" in result.message and "the 2 after it are vouched for by the chain only" in result.message


def test_a_truncated_log_verifies_alone_but_not_against_its_anchors(tmp_path) -> None:
    from corral.proxy.audit import verify, verify_anchored

    path = tmp_path / "audit.jsonl"
    written = _chain(path)
    anchors = _anchors(written, 3, 6)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:4]))  # the last two records cut off
    assert verify(path).ok  # the chain alone cannot tell
    result = verify_anchored(path, anchors)
    assert (result.status, result.ok, result.proven) == ("truncated", False, 3)
    assert "anchored record 6" in result.message and "ends at record 4" in result.message


def test_a_log_rewritten_whole_verifies_alone_but_not_against_its_anchors(tmp_path) -> None:
    from corral.proxy.audit import verify, verify_anchored

    path = tmp_path / "audit.jsonl"
    written = _chain(path)
    anchors = _anchors(written, 2, 5)
    path.unlink()
    _chain(path, tag="forged-", count=7)  # a fresh, internally consistent chain with other content
    assert verify(path).ok
    result = verify_anchored(path, anchors)
    assert (result.status, result.ok, result.anchor["seq"]) == ("rewritten", False, 2)
    assert "record 2 is not the one the gateway anchored" in result.message


def test_a_rewrite_after_the_anchors_is_only_vouched_for_by_the_chain(tmp_path) -> None:
    from corral.proxy.audit import verify_anchored

    path = tmp_path / "audit.jsonl"
    written = _chain(path)
    result = verify_anchored(path, _anchors(written, 3))
    assert result.ok and result.unproven == 3  # said plainly: 4-6 are not anchored


def test_without_anchors_verify_says_it_proves_consistency_only(tmp_path) -> None:
    from corral.proxy.audit import GENESIS, make_anchor, verify_anchored

    path = tmp_path / "audit.jsonl"
    _chain(path)
    result = verify_anchored(path, [])
    assert (result.status, result.ok) == ("unanchored", True)
    assert "proves only that the log is internally consistent" in result.message
    start = make_anchor(KEY, "ses_1", 0, GENESIS, "start")  # the session's start: no record yet
    assert verify_anchored(path, [start]).status == "unanchored"


def test_a_broken_chain_is_altered_whatever_the_anchors(tmp_path) -> None:
    from corral.proxy.audit import verify_anchored

    path = tmp_path / "audit.jsonl"
    written = _chain(path)
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"status":200', '"status":500')
    path.write_text("\n".join(lines) + "\n")
    result = verify_anchored(path, _anchors(written, 5))
    assert (result.status, result.chain.first_bad) == ("altered", 2)


def test_anchors_with_a_wrong_mac_another_session_or_a_bad_shape_are_refused(tmp_path) -> None:
    from corral.proxy.audit import make_anchor, parse_anchors, verify_anchored

    path = tmp_path / "audit.jsonl"
    written = _chain(path)
    forged = make_anchor(b"x" * 32, "ses_1", 6, written[5]["hash"], "poll")
    with pytest.raises(ValueError, match="MAC does not match"):
        parse_anchors([json.dumps(forged)], KEY)
    tampered = make_anchor(KEY, "ses_1", 6, written[5]["hash"], "poll")
    tampered["seq"] = 2  # moved to fit a cut log
    with pytest.raises(ValueError, match="line 1: its MAC"):
        parse_anchors([json.dumps(tampered)], KEY)
    for bad in ('{"v":1}', "[]", "nope", json.dumps({**tampered, "hash": "zz"})):
        with pytest.raises(ValueError, match="anchor line 1"):
            parse_anchors([bad], KEY)
    other = _anchors(written, 1, session="ses_2")
    with pytest.raises(ValueError, match="of session ses_2, the log of session ses_1"):
        verify_anchored(path, other)


# -- the record type, its writers and its readers --------------------------------------------------

ROOT = Path(__file__).resolve().parents[3]
BEFORE_SPLIT = Path(__file__).parent / "fixtures" / "audit-before-split.jsonl"


def test_every_event_s_fields_are_record_fields() -> None:
    from corral.proxy.audit import CHAIN_FIELDS, EVENT_FIELDS, RECORD_FIELDS, Event

    assert set(EVENT_FIELDS) == set(typing.get_args(Event))
    assert CHAIN_FIELDS | set().union(*EVENT_FIELDS.values()) == RECORD_FIELDS


def test_a_log_written_before_the_addon_split_still_verifies_and_reads() -> None:
    """The fixture was written by the single ``Egress`` addon (main at b97b1bd): one record of each
    event, a connection refused before any request among them."""
    from corral.proxy.audit import CHAIN_FIELDS, EVENT_FIELDS, verify_anchored
    from corral.proxy.traffic import read_records, summarize, to_har

    result = verify(BEFORE_SPLIT)
    assert result.ok and result.records == 8
    assert verify_anchored(BEFORE_SPLIT, []).status == "unanchored"
    records = list(read_records(BEFORE_SPLIT))
    assert [r["event"] for r in records] == [
        *("recovered", "proxy", "connect", "request", "block", "error", "error", "policy"),
    ]
    for record in records:
        assert set(record) <= CHAIN_FIELDS | EVENT_FIELDS[record["event"]], record
    assert [(s.host, s.requests, s.blocked, s.errors) for s in summarize(records)] == [
        ("198.51.100.7", 0, 0, 1),
        ("allowed.test", 1, 0, 1),
        ("blocked.test", 0, 1, 0),
    ]
    assert len(to_har(records, creator_version="0")["log"]["entries"]) == 3


def _table_rows(text: str) -> dict[str, set[str]]:
    """docs/egress.md's record field table: field -> the events listed for it."""
    start = text.index("| Field | Events | Meaning |")
    rows: dict[str, set[str]] = {}
    for line in text[start:].splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3:
            break
        rows[cells[0].strip("`")] = {event.strip() for event in cells[1].split(",")}
    return rows


def test_the_docs_field_table_lists_exactly_the_record_s_fields() -> None:
    from corral.proxy.audit import CHAIN_FIELDS, EVENT_FIELDS, RECORD_FIELDS

    rows = _table_rows((ROOT / "docs" / "egress.md").read_text())
    assert set(rows) == RECORD_FIELDS
    for field, events in rows.items():
        expected = {"all"} if field in CHAIN_FIELDS else {e for e, fields in EVENT_FIELDS.items() if field in fields}
        assert events == expected, field


def test_the_viewer_reads_only_record_fields() -> None:
    from corral.gateway.viewer import viewer_page
    from corral.proxy.audit import RECORD_FIELDS

    page = viewer_page("ses_x").body
    traffic = page[page.index("async function showTraffic") : page.index("function show(step)")]
    read = set(re.findall(r"\br\.(\w+)", traffic))
    assert read and read <= RECORD_FIELDS, read - RECORD_FIELDS


@pytest.mark.parametrize("module", ["corral/proxy/traffic.py", "corral/cli/auditwords.py"])
def test_python_readers_read_only_record_fields(module: str) -> None:
    """Every ``record.get("...")``, ``r.get("...")`` or ``record["..."]`` in a reader names a field."""
    from corral.proxy.audit import RECORD_FIELDS

    tree = ast.parse((ROOT / "services" / module).read_text())
    read: set[str] = set()
    for node in ast.walk(tree):
        target, key = None, None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target, key = node.func.value, node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript):
            target, key = node.value, node.slice
        if isinstance(target, ast.Name) and target.id in ("record", "r") and isinstance(key, ast.Constant):
            read.add(str(key.value))
    assert read and read <= RECORD_FIELDS, read - RECORD_FIELDS
