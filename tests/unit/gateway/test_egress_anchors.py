"""The gateway's side of the policy generation and the audit anchors, against a fake proxy that
speaks the real control protocol and keeps a real audit chain."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.gateway.egress import REASSERT_ACTOR, Egress, EgressManager
from corral.gateway.settings import GatewaySettings
from corral.proxy import control
from corral.proxy.audit import AuditLog, verify, verify_anchored
from corral.proxy.policy import parse_rule

SESSION = "ses_anchor1"


class FakeProxy:
    """The proxy's control channel as the addon answers it: generation, policy, chain head."""

    def __init__(self, state: Path, allow: list[str], mode: str) -> None:
        self.audit = AuditLog(state / "audit.jsonl", SESSION)
        self.audit.write("proxy", mode=mode, allow=allow)
        self.allow, self.mode, self.generation = [str(parse_rule(a)) for a in allow], mode, 0
        self.policies: list[dict[str, Any]] = []  # the policy messages the gateway sent
        self.server: asyncio.Server | None = None
        self.token = ""  # the gateway's token for this session

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    legacy = False  # answers as an image from before policy generations and chain heads

    def state(self) -> dict[str, Any]:
        if self.legacy:
            return {"allow": self.allow, "mode": self.mode}
        return {"allow": self.allow, "mode": self.mode, "generation": self.generation, "head": self.audit.head}

    def set(self, allow: list[str], mode: str, actor: str) -> None:
        self.generation += 1
        self.allow, self.mode = [str(parse_rule(a)) for a in allow], mode
        self.audit.write("policy", allow=self.allow, mode=mode, actor=actor, generation=self.generation)

    def traffic(self, count: int = 1) -> None:
        for i in range(count):
            self.audit.write("request", url=f"https://a.test/{i}", status=200)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = json.loads(await reader.readline())
        if hello.get("token") != self.token:
            writer.write(control.encode({"ok": False, "error": "unknown token"}))
            writer.close()
            return
        writer.write(control.encode({"ok": True, "role": "gateway"}))
        message = json.loads(await reader.readline())
        if message["op"] == "policy":
            self.policies.append(message)
            self.set(message["allow"], message["mode"], message["actor"])
        writer.write(control.encode({"ok": True, **self.state()}))
        await writer.drain()
        writer.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[EgressManager, FakeProxy, Egress]]:
    manager = EgressManager(GatewaySettings(data_dir=tmp_path / "data"), runtime=None)  # type: ignore[arg-type]
    state = manager.state_dir(SESSION)
    state.mkdir(parents=True)
    manager.record_start(SESSION, ["A.test"], "enforce")  # as prepare_blocking does
    proxy = FakeProxy(state, ["A.test"], "enforce")
    proxy.server = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
    manager.control_port = proxy.port
    proxy.token = manager.token(SESSION)  # derived by the gateway, as the real proxy is given it
    egress = Egress(SESSION, "net", "10.9.0.0/24", "10.9.0.1", "id", "proxy", "127.0.0.1", str(state))
    try:
        yield manager, proxy, egress
    finally:
        proxy.server.close()
        proxy.audit.close()


def anchors(manager: EgressManager) -> list[dict[str, Any]]:
    return manager.anchors.read(SESSION)


async def test_the_watchdog_anchors_each_new_head_and_accepts_the_gateways_policy(world) -> None:
    manager, proxy, egress = world
    assert await manager.check(egress) is True
    proxy.traffic(3)
    assert await manager.check(egress) is True
    assert await manager.check(egress) is True  # nothing new: no anchor
    book = anchors(manager)
    assert [(a["reason"], a["seq"]) for a in book] == [("start", 0), ("poll", 1), ("poll", 4)]
    assert book[0]["set"] == {"generation": 0, "allow": ["a.test"], "mode": "enforce"}
    assert book[-1]["hash"] == proxy.audit.head["hash"]
    assert proxy.policies == []


async def test_a_policy_changed_behind_the_gateways_back_is_logged_and_set_again(world, caplog) -> None:
    manager, proxy, egress = world
    await manager.set_policy(egress, ["a.test", "b.test"], "enforce", "api-key:k1")
    proxy.set(["*.evil.test"], "report", "someone")  # another holder of the gateway's token
    with caplog.at_level(logging.ERROR, logger="corral.gateway.egress"):
        assert await manager.check(egress) is False
    assert "changed behind the gateway's back" in caplog.text and "generation 2" in caplog.text
    assert proxy.policies[-1] == {
        "op": "policy",
        "allow": ["a.test", "b.test"],
        "mode": "enforce",
        "actor": REASSERT_ACTOR,
    }
    assert (proxy.allow, proxy.mode, proxy.generation) == (["a.test", "b.test"], "enforce", 3)
    assert anchors(manager)[-1]["reason"] == "reassert"
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="corral.gateway.egress"):
        assert await manager.check(egress) is True  # settled
    assert caplog.text == ""


async def test_the_same_generation_with_another_policy_is_caught_too(world) -> None:
    manager, proxy, egress = world
    # policy.json rewritten by the proxy's uid and the proxy restarted: same generation, other policy.
    proxy.allow = ["evil.test"]
    assert await manager.check(egress) is False
    assert proxy.allow == ["a.test"] and proxy.policies[-1]["actor"] == REASSERT_ACTOR


async def test_setting_a_policy_notices_a_generation_the_gateway_did_not_count(world, caplog) -> None:
    manager, proxy, egress = world
    proxy.set(["evil.test"], "enforce", "someone")
    with caplog.at_level(logging.ERROR, logger="corral.gateway.egress"):
        reply = await manager.set_policy(egress, ["a.test"], "enforce", "api-key:k1")
    assert reply.generation == 2
    assert "someone else changed the proxy's policy" in caplog.text
    assert manager.expected(SESSION) is not None and manager.expected(SESSION).generation == 2


async def test_a_restarted_gateway_holds_the_proxy_to_the_policy_on_record(world, tmp_path: Path) -> None:
    manager, proxy, egress = world
    await manager.set_policy(egress, ["b.test"], "report", "api-key:k1")
    again = EgressManager(GatewaySettings(data_dir=tmp_path / "data"), runtime=None)  # type: ignore[arg-type]
    again.control_port = proxy.port
    assert again.expected(SESSION) is not None and again.expected(SESSION).allow == ("b.test",)
    proxy.set(["evil.test"], "report", "someone")
    assert await again.check(egress) is False
    assert proxy.allow == ["b.test"]


async def test_the_end_anchor_comes_from_the_proxy_and_verify_catches_a_cut_and_a_rewrite(world) -> None:
    manager, proxy, egress = world
    proxy.traffic(2)
    await manager.check(egress)
    proxy.traffic(2)
    await asyncio.to_thread(manager.channel.anchor_end_blocking, egress)  # what teardown_blocking does first
    book = anchors(manager)
    assert book[-1]["reason"] == "end" and book[-1]["seq"] == proxy.audit.seq == 5
    log = Path(egress.state_dir) / "audit.jsonl"
    assert verify_anchored(log, book).status == "intact"
    whole = log.read_bytes()
    log.write_bytes(b"".join(whole.splitlines(keepends=True)[:4]))  # the last record gone
    assert verify(log).ok and verify_anchored(log, book).status == "truncated"
    log.unlink()
    forged = AuditLog(log, SESSION)
    for i in range(5):
        forged.write("request", url=f"https://innocent.test/{i}", status=200)
    forged.close()
    assert verify(log).ok and verify_anchored(log, book).status == "rewritten"


async def test_a_chain_that_goes_back_is_reported_at_once(world, caplog) -> None:
    manager, proxy, egress = world
    proxy.traffic(3)
    await manager.check(egress)
    proxy.audit._seq, proxy.audit._prev = 2, "f" * 64  # a proxy restarted on a cut log
    with caplog.at_level(logging.ERROR, logger="corral.gateway.egress"):
        await manager.check(egress)
    assert "not the one anchored" in caplog.text


async def test_the_key_and_anchors_are_private_and_tampering_is_refused(world) -> None:
    manager, _proxy, egress = world
    await manager.check(egress)
    book = manager.anchors
    assert stat.S_IMODE(book.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(book.key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(book.path(SESSION).stat().st_mode) == 0o600
    assert not book.root.is_relative_to(manager.root)  # never inside a proxy's bind-mounted state
    lines = book.path(SESSION).read_text().splitlines()
    moved = json.loads(lines[-1])
    moved["seq"] += 5  # made to fit a longer, rewritten log
    book.path(SESSION).write_text("\n".join([*lines[:-1], json.dumps(moved)]) + "\n")
    with pytest.raises(ValueError, match="MAC does not match"):
        book.text(SESSION)


async def test_a_proxy_from_an_older_image_is_still_served(world) -> None:
    manager, proxy, egress = world
    proxy.legacy = True  # a live session's proxy when the gateway was upgraded under it
    assert (await manager.status(egress)).allow == ("a.test",)
    assert await manager.check(egress) is True
    await manager.set_policy(egress, ["b.test"], "enforce", "api-key:k1")
    await asyncio.to_thread(manager.channel.anchor_end_blocking, egress)
    assert [a["reason"] for a in anchors(manager)] == ["start"]  # nothing to anchor, nothing broken
