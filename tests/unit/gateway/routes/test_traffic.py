"""Audit logs over HTTP on a gateway without egress control (the logs themselves: tests/integration),
and what of a log a viewer link reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.errors import Forbidden
from corral.gateway.routes import traffic as traffic_routes
from corral.proxy.traffic import TrafficFilter

from .conftest import KEY, Client


async def test_a_gateway_without_egress_has_no_audit_logs(client: Client) -> None:
    async with client(KEY) as owner:
        created = (await owner.post("/v1/sessions", json={})).json()
        assert (await owner.get("/v1/audit")).json() == []
        for suffix in ("traffic", "traffic.har", "traffic.anchors"):
            reply = await owner.get(f"/v1/sessions/{created['id']}/{suffix}")
            assert reply.status_code == 404
            assert reply.json()["error"]["message"] == "this gateway runs sessions without egress control"
    async with client() as anon:
        assert (await anon.get("/v1/audit")).status_code == 401


def test_a_viewer_link_reads_one_action_s_traffic_and_none_of_the_rest(tmp_path: Path) -> None:
    records = [
        {"seq": 1, "event": "policy", "action": None},
        {"seq": 2, "event": "link", "action": None},
        {"seq": 3, "event": "connect", "action": "act_1"},
        {"seq": 4, "event": "request", "action": "act_1"},
        {"seq": 5, "event": "control", "action": "act_1"},
        {"seq": 6, "event": "request", "action": "act_2"},
    ]
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(Forbidden, match="action="):
        traffic_routes._link_events(TrafficFilter())
    with pytest.raises(Forbidden, match="only these events"):
        traffic_routes._link_events(TrafficFilter(action="act_1", event="link"))
    wanted = TrafficFilter(action="act_1")
    lines = traffic_routes._filtered_lines(log, wanted, traffic_routes._link_events(wanted))
    assert [json.loads(line)["seq"] for line in lines] == [3, 4]
    assert len(list(traffic_routes._filtered_lines(log, TrafficFilter()))) == 6  # its owner reads it all


def _log_of(path: Path, records: int, **extra: object) -> Path:
    from corral.proxy.audit import AuditLog

    log = AuditLog(path, "ses_x")
    for n in range(records):
        log.write("request", id=f"f{n}", url=f"https://a.test/{n}", host="a.test", decision="allow", **extra)  # type: ignore[arg-type]
    log.close()
    return path


def test_a_log_is_read_in_bounded_chunks_up_to_its_size_when_the_reading_began(tmp_path: Path) -> None:
    log = _log_of(tmp_path / "audit.jsonl", 2000, request_headers=[("x", "v" * 200)])
    size = log.stat().st_size
    chunks = traffic_routes._filtered_chunks(log, TrafficFilter())
    first = next(chunks)
    with log.open("ab") as out:
        out.write(b'{"grown": "after the reading began"}\n')
    rest = list(chunks)
    assert all(len(chunk) < traffic_routes.CHUNK_BYTES + 1024 for chunk in [first, *rest])
    assert len(first) + sum(len(chunk) for chunk in rest) == size and len(rest) > 3


async def test_an_unreadable_log_is_an_error_answer_before_the_stream_starts(tmp_path: Path) -> None:
    from corral.errors import AuditLogUnreadable

    log = tmp_path / "audit.jsonl"
    log.write_bytes(b"<html>\n")
    with pytest.raises(AuditLogUnreadable, match="not JSON"):
        await traffic_routes._streamed(traffic_routes._filtered_chunks(log, TrafficFilter()), "application/jsonl")
    log.write_bytes(b"x" * (2 << 20) + b"\n")
    with pytest.raises(AuditLogUnreadable, match="longer than"):
        await traffic_routes._streamed(traffic_routes._filtered_chunks(log, TrafficFilter()), "application/jsonl")
    records = traffic_routes._records(log)
    with pytest.raises(AuditLogUnreadable, match="longer than"):
        next(records)


async def test_har_is_streamed_as_one_valid_document(tmp_path: Path) -> None:
    log = _log_of(tmp_path / "audit.jsonl", 500)
    records = TrafficFilter(host="a.test").apply(traffic_routes._records(log))
    from corral.proxy.traffic import har_chunks

    pieces = list(traffic_routes._batched(p.encode() for p in har_chunks(records, creator_version="0")))
    har = json.loads(b"".join(pieces))
    assert len(har["log"]["entries"]) == 500 and len(pieces) > 1
