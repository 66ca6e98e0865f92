"""Audit logs over HTTP on a gateway without egress control (the logs themselves: tests/integration)."""

from __future__ import annotations

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
