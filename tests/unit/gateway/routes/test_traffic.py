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
    assert len(traffic_routes._filtered_lines(log, TrafficFilter())) == 6  # its owner reads it all
