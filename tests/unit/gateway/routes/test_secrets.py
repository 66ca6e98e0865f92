"""Brokered secrets through the API: declared at create, shown as placeholders only, changed by PATCH
(the owner's key only), refused whole with the field to blame, and never a value in a reply, a log
record or a file the gateway wrote. Over a fake runtime, a fake proxy that speaks the control protocol
and a fake controller that proves its secret."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from corral.contracts.placeholders import MAX_SECRETS, PLACEHOLDER
from corral.errors import SessionNotFound
from corral.gateway.app import build_sessions
from corral.gateway.models import SecretUpdate, Viewport
from corral.gateway.sessions import SessionManager
from corral.runtime import SandboxAddress, SandboxSpec

from ...runtime.fake import FakeRuntime
from ..controller_fake import SECRET, proving
from ..proxy_fake import FakeControlProxy, ProxyState
from .conftest import KEY, OTHER_KEY, client_for, settings_for, wired

VALUE = "ghp_the-real-value-0123456789"
ROTATED = "ghp_rotated-value-9876543210"
GITHUB = {"value": VALUE, "allow": ["GET,POST api.example.test/v1/"]}


class ProvenRuntime(FakeRuntime):
    """Sandboxes whose controllers know the fake controller's per-boot secret."""

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        box = super().start_sandbox(spec)
        proven = SandboxAddress(box.id, box.name, box.host, box.port, SECRET)
        self.running[box.id] = (proven, self.running[box.id][1])
        return proven


@dataclass
class FakeController:
    """Every sandbox's controller: what ``PUT /v1/secrets`` each was sent and holds (``GET`` answers
    it); ``status`` what a PUT answers, ``statuses`` the answers of the next PUTs before that."""

    puts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (sandbox host, body)
    held: dict[str, dict[str, str]] = field(default_factory=dict)  # sandbox host -> its placeholders
    status: int = 200
    statuses: list[int] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/secrets" and request.method in ("GET", "PUT")
        if request.method == "GET":
            return httpx.Response(200, json={"ok": True, "secrets": self.held.get(request.url.host, {})})
        status = self.statuses.pop(0) if self.statuses else self.status
        if status >= 300:
            return httpx.Response(status, json={"ok": False})
        body = httpx.Response(200, content=request.content).json()
        self.puts.append((request.url.host, body))
        self.held[request.url.host] = body["secrets"]
        return httpx.Response(200, json={"ok": True})


@dataclass
class World:
    app: FastAPI
    manager: SessionManager
    runtime: ProvenRuntime
    proxy: FakeControlProxy
    controller: FakeController
    data_dir: Path

    def proxy_of(self, session_id: str) -> ProxyState:
        assert self.manager.egress is not None
        return self.proxy.state(self.manager.egress.token(session_id))

    def client(self, credential: str | None = KEY) -> httpx.AsyncClient:
        return client_for(self.app, credential)

    def files_text(self) -> str:
        """Every file the gateway wrote under its data dir, as text."""
        return "\n".join(p.read_bytes().decode(errors="replace") for p in self.data_dir.rglob("*") if p.is_file())


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    settings = settings_for(tmp_path, egress=True, pool_size=0)
    app = wired(settings)
    runtime = ProvenRuntime()
    proxy, controller = FakeControlProxy(), FakeController()
    controllers = httpx.MockTransport(proving(controller.handle))
    store = app.state.manager.book.store
    manager = app.state.manager = build_sessions(settings, runtime, store, controller_transport=controllers)
    await proxy.start()
    await manager.start()
    assert manager.egress is not None
    manager.egress.control_port = proxy.port
    try:
        yield World(app, manager, runtime, proxy, controller, tmp_path)
    finally:
        await manager.stop()
        await app.state.http.aclose()
        proxy.close()


async def _create(world: World, **body: Any) -> httpx.Response:
    async with world.client() as owner:
        return await owner.post("/v1/sessions", json={"allow": ["api.example.test"], **body})


async def test_a_session_made_with_secrets_shows_placeholders_only(world: World) -> None:
    created = await _create(world, secrets={"GITHUB_TOKEN": GITHUB})
    assert created.status_code == 201, created.text
    session = created.json()
    placeholder = session["secrets"]["GITHUB_TOKEN"]
    assert PLACEHOLDER.fullmatch(placeholder)
    # The proxy was given the whole set, value and bindings, before the token was handed out ...
    [op] = world.proxy_of(session["id"]).secrets_ops()
    assert op == {
        "op": "secrets",
        "actor": "api-key:owner",  # the proxy writes it where the agent reads: never the key's id
        "secrets": [
            {
                "name": "GITHUB_TOKEN",
                "placeholder": placeholder,
                "value": VALUE,
                "allow": ["GET,POST api.example.test/v1/"],
                "in": ["header"],
            }
        ],
    }
    # ... and the controller the placeholders (its commands' environment), nothing else.
    assert world.controller.puts == [
        (world.manager.get(session["id"]).sandbox.host, {"secrets": {"GITHUB_TOKEN": placeholder}})
    ]
    path = f"/v1/sessions/{session['id']}"
    async with world.client() as owner, world.client(session["token"]) as holder:
        assert (await owner.get(f"{path}/secrets")).json() == {"GITHUB_TOKEN": placeholder}
        assert (await holder.get(f"{path}/secrets")).json() == {"GITHUB_TOKEN": placeholder}
        assert (await holder.get(path)).json()["secrets"] == {"GITHUB_TOKEN": placeholder}
        listed = (await owner.get("/v1/sessions")).json()
        async with world.client(OTHER_KEY) as other:
            assert (await other.get(f"{path}/secrets")).status_code == 403
    assert listed[0]["secrets"] == {"GITHUB_TOKEN": placeholder}
    record = world.manager.get(session["id"]).record.to_json()
    assert record["secrets"] == {
        "GITHUB_TOKEN": {
            "placeholder": placeholder,
            "allow": ["GET,POST api.example.test/v1/"],
            "locations": ["header"],
        }
    }


async def test_a_session_without_secrets_sends_neither_the_op_nor_the_placeholders(world: World) -> None:
    created = await _create(world)
    assert created.status_code == 201 and created.json()["secrets"] == {}
    assert world.proxy_of(created.json()["id"]).secrets_ops() == [] and world.controller.puts == []


def _many(count: int) -> dict[str, Any]:
    return {f"S{i}": GITHUB for i in range(count)}


@pytest.mark.parametrize(
    ("secrets", "extra", "field", "words"),
    [
        ({"lower": GITHUB}, {}, "secrets.lower", "A-Z 0-9 _"),
        ({"PATH": GITHUB}, {}, "secrets.PATH", "reserved"),
        ({"S": {**GITHUB, "value": "short"}}, {}, "secrets.S.value", "at least 8"),
        ({"S": {**GITHUB, "value": "x" * 4097}}, {}, "secrets.S.value", "at most 4096 bytes"),
        ({"S": {**GITHUB, "value": VALUE + "\r\nX-Evil: 1"}}, {}, "secrets.S.value", "CR or LF"),
        ({"S": {**GITHUB, "allow": ["has space"]}}, {}, "secrets.S.allow.0", "unknown method"),
        ({"S": {**GITHUB, "allow": []}}, {}, "secrets.S.allow", "at least 1"),
        ({"S": {**GITHUB, "allow": ["api.example.test"] * 17}}, {}, "secrets.S.allow", "at most 16"),
        ({"S": {**GITHUB, "allow": ["other.example.test"]}}, {}, "secrets.S.allow", "not within"),
        ({"S": {**GITHUB, "allow": ["api.example.test:8443"]}}, {}, "secrets.S.allow", "not within"),
        ({"S": {**GITHUB, "in": ["cookie"]}}, {}, "secrets.S.in.0", "header"),
        ({"S": {**GITHUB, "in": []}}, {}, "secrets.S.in", "at least 1"),
        ({"S": {**GITHUB, "colour": "red"}}, {}, "secrets.S.colour", "Extra inputs"),
        (_many(MAX_SECRETS + 1), {}, "secrets", f"at most {MAX_SECRETS}"),
        ({"S": GITHUB}, {"hermetic": "rsp_0123456789abcdef"}, "secrets", "hermetic"),
    ],
)
async def test_a_bad_declaration_is_refused_whole_with_its_field(
    world: World, secrets: dict[str, Any], extra: dict[str, Any], field: str, words: str
) -> None:
    refused = await _create(world, secrets=secrets, **extra)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_request", field)
    assert words in error["message"]
    assert VALUE not in refused.text and "x" * 16 not in refused.text
    assert world.manager.list() == [] and world.runtime.running == {} and world.proxy.states == {}


async def test_a_proxy_or_controller_that_refuses_leaves_no_session(world: World) -> None:
    world.proxy.refuse.add("secrets")
    refused = await _create(world, secrets={"S": GITHUB})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "sandbox_start_failed"
    world.proxy.refuse.clear()
    world.controller.status = 500
    refused = await _create(world, secrets={"S": GITHUB})
    assert refused.status_code == 503
    assert world.manager.list() == [] and world.runtime.running == {}
    # No proxy left but those started ahead with the grounds the pool holds (none of them was a session's).
    grounds = world.manager.grounds
    if grounds is not None:
        await asyncio.wait_for(grounds.filled.wait(), 10)  # a refill under way: its proxy is not held yet
    held = {g.session_id for g in grounds.held()} if grounds is not None else set()
    assert set(world.runtime.proxies) <= held
    assert VALUE not in refused.text


async def test_a_gateway_without_egress_control_takes_no_secrets(tmp_path: Path) -> None:
    app = wired(settings_for(tmp_path))
    async with client_for(app, KEY) as owner:
        refused = await owner.post("/v1/sessions", json={"allow": ["api.example.test"], "secrets": {"S": GITHUB}})
    await app.state.http.aclose()
    assert refused.status_code == 409
    assert (refused.json()["error"]["code"], refused.json()["error"]["field"]) == ("egress_off", "secrets")
    assert "hermetic" not in refused.json()["error"]["message"]


async def _patch(world: World, session_id: str, body: dict[str, Any], credential: str = KEY) -> httpx.Response:
    async with world.client(credential) as caller:
        return await caller.patch(f"/v1/sessions/{session_id}", json=body)


async def test_patch_adds_rotates_rebinds_and_revokes(world: World) -> None:
    session = (await _create(world, secrets={"GITHUB_TOKEN": GITHUB})).json()
    sid, placeholder = session["id"], session["secrets"]["GITHUB_TOKEN"]
    proxy = world.proxy_of(sid)
    sent = len(proxy.messages)  # a proxy started ahead with a ground got the session's policy at the create
    added = await _patch(
        world,
        sid,
        {
            "secrets": {
                "NPM_TOKEN": {"value": "npm_0123456789", "allow": ["api.example.test"], "in": ["header", "basic"]}
            }
        },
    )
    assert added.status_code == 200, added.text
    assert set(added.json()["secrets"]) == {"GITHUB_TOKEN", "NPM_TOKEN"}
    assert added.json()["secrets"]["GITHUB_TOKEN"] == placeholder
    assert [e["name"] for e in proxy.secrets_ops()[-1]["secrets"]] == ["GITHUB_TOKEN", "NPM_TOKEN"]  # the whole set
    rotated = await _patch(world, sid, {"secrets": {"GITHUB_TOKEN": {"value": ROTATED}}})
    assert rotated.status_code == 200 and rotated.json()["secrets"]["GITHUB_TOKEN"] == placeholder  # never changes
    entry = proxy.secrets["GITHUB_TOKEN"]
    assert (entry["value"], entry["allow"], entry["in"]) == (ROTATED, ["GET,POST api.example.test/v1/"], ["header"])
    rebound = await _patch(world, sid, {"secrets": {"GITHUB_TOKEN": {"allow": ["GET api.example.test/v1/repos/"]}}})
    assert rebound.status_code == 200
    assert (proxy.secrets["GITHUB_TOKEN"]["value"], proxy.secrets["GITHUB_TOKEN"]["allow"]) == (
        ROTATED,
        ["GET api.example.test/v1/repos/"],
    )
    revoked = await _patch(world, sid, {"secrets": {"NPM_TOKEN": None}})
    assert revoked.status_code == 200 and revoked.json()["secrets"] == {"GITHUB_TOKEN": placeholder}
    assert sorted(proxy.secrets) == ["GITHUB_TOKEN"]
    assert world.controller.puts[-1][1] == {"secrets": {"GITHUB_TOKEN": placeholder}}
    # A PATCH of secrets alone leaves the policy be: no policy op was sent.
    assert [m["op"] for m in proxy.messages[sent:]] == ["secrets"] * 4  # one for each PATCH
    assert [m["actor"] for m in proxy.messages[sent:]] == ["api-key:owner"] * 4


async def test_patch_may_widen_the_allowlist_and_bind_a_secret_to_it_at_once(world: World) -> None:
    sid = (await _create(world)).json()["id"]
    sent = len(world.proxy_of(sid).messages)  # a ground's proxy got the session's policy at the create
    body = {"allow": ["api.example.test", "*.other.test"], "secrets": {"S": {**GITHUB, "allow": ["x.other.test/"]}}}
    patched = await _patch(world, sid, body)
    assert patched.status_code == 200, patched.text
    assert [m["op"] for m in world.proxy_of(sid).messages[sent:]] == ["policy", "secrets"]


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"secrets": {"UNKNOWN": None}}, "secrets.UNKNOWN", "no secret UNKNOWN in this session"),
        ({"secrets": {"UNKNOWN": {"value": ROTATED}}}, "secrets.UNKNOWN", "no secret UNKNOWN"),
        ({"secrets": {"NEW": {"allow": ["api.example.test"]}}}, "secrets.NEW.value", "give its value"),
        ({"secrets": {"GITHUB_TOKEN": {}}}, "secrets.GITHUB_TOKEN", "give the secret's value"),
        ({"secrets": {"GITHUB_TOKEN": {"value": "short"}}}, "secrets.GITHUB_TOKEN.value", "at least 8"),
        ({"secrets": {"GITHUB_TOKEN": {"allow": ["elsewhere.test"]}}}, "secrets.GITHUB_TOKEN.allow", "not within"),
        ({"allow": ["other.test"]}, "allow", "not within"),  # a narrowed allowlist would strand a binding
        (
            {"allow": ["other.test"], "secrets": {"GITHUB_TOKEN": None, "NEW": GITHUB}},
            "secrets.NEW.allow",
            "not within",
        ),
        ({"secrets": _many(MAX_SECRETS)}, "secrets", f"at most {MAX_SECRETS}"),
    ],
)
async def test_a_bad_patch_changes_nothing_and_names_its_field(
    world: World, body: dict[str, Any], field: str, words: str
) -> None:
    session = (await _create(world, secrets={"GITHUB_TOKEN": GITHUB})).json()
    before = world.manager.get(session["id"]).record
    proxy = world.proxy_of(session["id"])
    sent = len(proxy.messages)
    refused = await _patch(world, session["id"], body)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert (error["field"], words in error["message"]) == (field, True), error
    assert world.manager.get(session["id"]).record == before and len(proxy.messages) == sent
    assert proxy.secrets["GITHUB_TOKEN"]["value"] == VALUE and ROTATED not in refused.text


async def test_only_the_owners_key_changes_secrets(world: World) -> None:
    session = (await _create(world, secrets={"GITHUB_TOKEN": GITHUB})).json()
    refused = await _patch(world, session["id"], {"secrets": {"GITHUB_TOKEN": None}}, credential=session["token"])
    assert refused.status_code == 403 and "owner's API key" in refused.json()["error"]["message"]
    other = await _patch(world, session["id"], {"secrets": {"GITHUB_TOKEN": None}}, credential=OTHER_KEY)
    assert other.status_code == 403
    assert sorted(world.proxy_of(session["id"]).secrets) == ["GITHUB_TOKEN"]


async def test_a_controller_that_fails_a_patch_changes_nothing_on_the_proxy(world: World) -> None:
    session = (await _create(world, secrets={"GITHUB_TOKEN": GITHUB})).json()
    sid = session["id"]
    before = world.manager.get(sid).record
    sent = len(world.proxy_of(sid).messages)  # a ground's proxy got the session's policy at the create
    world.controller.status = 500
    body = {
        "allow": ["api.example.test", "b.test"],
        "secrets": {"GITHUB_TOKEN": {"value": ROTATED}, "B": {**GITHUB, "allow": ["b.test"]}},
    }
    failed = await _patch(world, sid, body)
    assert failed.status_code == 502 and failed.json()["error"]["code"] == "sandbox_unreachable"
    proxy = world.proxy_of(sid)
    # The controller goes first: it failed, so the proxy never saw the new set; the policy is set back.
    assert [m["op"] for m in proxy.messages[sent:]] == ["policy", "policy"]
    assert sorted(proxy.secrets) == ["GITHUB_TOKEN"] and proxy.secrets["GITHUB_TOKEN"]["value"] == VALUE
    assert proxy.allow == ["api.example.test"]
    assert world.manager.get(sid).record == before
    assert (
        world.manager.egress is not None
        and world.manager.egress.vault.get(sid).values["GITHUB_TOKEN"].get_secret_value() == VALUE
    )


async def test_a_patch_gives_the_controller_both_sets_then_the_proxy_the_new_then_the_controller_the_new(
    world: World,
) -> None:
    session = (await _create(world, secrets={"A": GITHUB})).json()
    sid, a = session["id"], session["secrets"]["A"]
    patched = await _patch(world, sid, {"secrets": {"A": None, "B": GITHUB}})
    assert patched.status_code == 200, patched.text
    b = patched.json()["secrets"]["B"]
    assert [body["secrets"] for _, body in world.controller.puts] == [{"A": a}, {"A": a, "B": b}, {"B": b}]
    assert sorted(world.proxy_of(sid).secrets) == ["B"]
    # A controller failing the last step leaves the change made (the proxy holds it, the agent has
    # the new placeholders among the old); the watchdog puts the right set later.
    world.controller.statuses = [200, 500]
    patched = await _patch(world, sid, {"secrets": {"C": GITHUB}})
    assert patched.status_code == 200 and sorted(world.proxy_of(sid).secrets) == ["B", "C"]
    await world.manager.broker.check_placeholders()
    assert world.controller.puts[-1][1]["secrets"] == patched.json()["secrets"]


async def test_no_value_in_any_reply_log_record_or_file(world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    replies: list[str] = []
    created = await _create(world, secrets={"GITHUB_TOKEN": GITHUB})
    sid = created.json()["id"]
    replies.append(created.text)
    for body in (
        {"secrets": {"GITHUB_TOKEN": {"value": ROTATED}}},
        {"secrets": {"GITHUB_TOKEN": {"value": VALUE + "\n"}}},  # refused: its message must not quote it
        {"secrets": {"NEW": {"value": VALUE, "allow": ["elsewhere.test"]}}},
        {"secrets": {"lower": {"value": VALUE, "allow": ["api.example.test"]}}},
    ):
        replies.append((await _patch(world, sid, body)).text)
    async with world.client() as owner:
        replies.append((await owner.get(f"/v1/sessions/{sid}")).text)
        replies.append((await owner.get(f"/v1/sessions/{sid}/secrets")).text)
        replies.append((await owner.get("/v1/sessions")).text)
    world.controller.status = 500
    replies.append((await _patch(world, sid, {"secrets": {"GITHUB_TOKEN": {"value": VALUE}}})).text)
    assert world.manager.egress is not None
    world.proxy_of(sid).restart()
    assert await world.manager.egress.check(world.manager.get(sid).egress) is False  # type: ignore[arg-type]
    logged = caplog.text + "".join(repr(r.args) for r in caplog.records)
    for value in (VALUE, ROTATED):
        assert all(value not in reply for reply in replies)
        assert value not in logged
        assert value not in world.files_text()
        assert value not in repr(world.manager.get(sid).record) and value not in repr(
            world.manager.egress.vault.get(sid)
        )


async def _restart_gateway(world: World) -> SessionManager:
    await world.manager.stop()
    controllers = httpx.MockTransport(proving(world.controller.handle))
    store = world.manager.book.store
    restarted = build_sessions(world.app.state.settings, world.runtime, store, controller_transport=controllers)
    await restarted.start()
    assert restarted.egress is not None
    restarted.egress.control_port = world.proxy.port
    world.app.state.manager = world.manager = restarted
    return restarted


async def test_after_a_gateway_restart_placeholders_answer_and_changes_need_only_new_values(world: World) -> None:
    session = (await _create(world, secrets={"A": GITHUB, "B": GITHUB})).json()
    sid = session["id"]
    restarted = await _restart_gateway(world)
    async with world.client() as owner:
        assert (await owner.get(f"/v1/sessions/{sid}/secrets")).json() == session["secrets"]
    assert restarted.egress is not None and restarted.egress.vault.get(sid).missing_values() == ["A", "B"]
    # The allowlist or the mode alone need no value ...
    widened = await _patch(world, sid, {"allow": ["api.example.test", "other.test"]})
    assert widened.status_code == 200, widened.text
    assert (await _patch(world, sid, {"egress_mode": "report"})).status_code == 200
    # ... nor does a rotation of one, a rebinding, a revocation or an addition: the proxy keeps the
    # values it holds for the secrets sent without one.
    rotated = await _patch(world, sid, {"secrets": {"A": {"value": ROTATED}}})
    assert rotated.status_code == 200, rotated.text
    proxy = world.proxy_of(sid)
    assert (proxy.secrets["A"]["value"], proxy.secrets["B"]["value"]) == (ROTATED, VALUE)
    rebound = await _patch(world, sid, {"secrets": {"B": {"allow": ["GET api.example.test/v2/"]}}})
    assert rebound.status_code == 200 and proxy.secrets["B"]["value"] == VALUE
    assert proxy.secrets["B"]["allow"] == ["GET api.example.test/v2/"]
    changed = await _patch(world, sid, {"secrets": {"A": None, "C": {**GITHUB, "allow": ["other.test"]}}})
    assert changed.status_code == 200 and sorted(changed.json()["secrets"]) == ["B", "C"]
    assert sorted(proxy.secrets) == ["B", "C"] and proxy.loaded
    assert restarted.egress.vault.get(sid).missing_values() == ["B"]
    assert await restarted.egress.check(restarted.get(sid).egress) is True  # type: ignore[arg-type]


async def test_a_pooled_pair_gets_the_policy_then_the_secrets_or_is_removed(world: World) -> None:
    for _ in range(2):  # two pooled pairs, as the pool loop starts them
        world.manager.pool.add(await world.manager.parts.starts.start("pool", Viewport(), None, [], "enforce"))
    created = await _create(world, secrets={"S": GITHUB})
    assert created.status_code == 201 and created.json()["from_pool"] is True
    assert [m["op"] for m in world.proxy_of(created.json()["id"]).messages] == ["policy", "secrets"]
    world.controller.status = 500
    refused = await _create(world, secrets={"S": GITHUB})
    assert refused.status_code == 503 and world.manager.pool.pairs() == []
    assert len(world.manager.list()) == 1 and len(world.runtime.running) == 1  # the claimed pair went


async def test_a_revocation_a_failing_controller_refused_changes_nothing(world: World) -> None:
    session = (await _create(world, secrets={"A": GITHUB, "B": GITHUB})).json()
    sid = session["id"]
    world.controller.status = 500
    failed = await _patch(world, sid, {"secrets": {"B": None}})
    assert failed.status_code == 502
    # The controller went first and failed: the proxy was never told, B stands everywhere.
    assert sorted(world.proxy_of(sid).secrets) == ["A", "B"]
    async with world.client() as owner:
        assert (await owner.get(f"/v1/sessions/{sid}/secrets")).json() == session["secrets"]
    assert sorted(world.manager.get(sid).record.secrets) == ["A", "B"]


@pytest.mark.parametrize("ending", ["delete", "timeout"])
async def test_a_session_ended_during_a_patch_keeps_no_secrets_and_no_record(world: World, ending: str) -> None:
    sid = (await _create(world, secrets={"A": GITHUB})).json()["id"]
    session = world.manager.get(sid)
    world.proxy.held["secrets"] = gate = asyncio.Event()
    patch = asyncio.create_task(_patch(world, sid, {"secrets": {"A": {"value": ROTATED}}}))
    await world.proxy.holding.wait()  # the PATCH is with the proxy
    if ending == "delete":
        end = asyncio.ensure_future(world.manager.delete(sid))
    else:
        world.manager.endings.end_soon(session, "timeout")
        end = asyncio.ensure_future(session.removed.wait())
    await asyncio.sleep(0)
    assert not end.done()  # the end waits for the change under way
    gate.set()
    answered = await patch
    await end
    assert answered.status_code == 404
    assert world.manager.egress is not None and world.manager.egress.vault.held() == set()
    assert sid not in [record.id for record in world.manager.book.stored_records()]
    assert ROTATED not in world.files_text()


async def test_a_patch_after_the_end_began_changes_nothing(world: World) -> None:
    sid = (await _create(world, secrets={"A": GITHUB})).json()["id"]
    session = world.manager.get(sid)
    world.manager.endings.mark_ended(session, "deleted")
    with pytest.raises(SessionNotFound):
        await world.manager.update_egress(session, None, None, "api-key:k", {"A": SecretUpdate(value=ROTATED)})  # type: ignore[arg-type]
    assert world.proxy_of(sid).secrets["A"]["value"] == VALUE


async def test_a_restarted_controller_gets_its_placeholders_again(world: World) -> None:
    session = (await _create(world, secrets={"A": GITHUB})).json()
    host = world.manager.get(session["id"]).sandbox.host
    sent = len(world.controller.puts)
    await world.manager.broker.check_placeholders()
    assert len(world.controller.puts) == sent  # it holds them: nothing sent
    world.controller.held[host] = {}  # the controller restarted inside its container
    await world.manager.broker.check_placeholders()
    assert world.controller.puts[-1] == (host, {"secrets": session["secrets"]})
    assert world.controller.held[host] == session["secrets"]


async def test_a_revocation_whose_answer_and_status_were_lost_is_taken_by_the_watchdog(world: World) -> None:
    session = (await _create(world, secrets={"A": GITHUB, "B": GITHUB})).json()
    sid = session["id"]
    world.proxy.lose |= {"secrets", "status"}  # the proxy applies the change; nothing comes back
    failed = await _patch(world, sid, {"secrets": {"B": None}})
    assert failed.status_code == 503 and sorted(world.proxy_of(sid).secrets) == ["A"]
    world.proxy.lose.clear()
    manager = world.manager
    assert manager.egress is not None
    await manager.egress.check(manager.get(sid).egress)  # type: ignore[arg-type]
    # taken, not sent again (a reassert of A and B would be refused: B's placeholder is revoked)
    assert manager.egress.vault.get(sid).names == ["A"] and len(world.proxy_of(sid).secrets_ops()) == 2
    await manager.broker.check_placeholders()  # the record and the controller follow
    assert list(manager.get(sid).record.secrets) == ["A"]
    assert world.controller.puts[-1][1] == {"secrets": {"A": session["secrets"]["A"]}}
    later = await _patch(world, sid, {"secrets": {"C": GITHUB}})
    assert later.status_code == 200 and sorted(later.json()["secrets"]) == ["A", "C"]


async def test_a_session_token_cannot_give_secret_values_at_a_resume(world: World) -> None:
    """The agent's token may neither pause nor resume its session (the owner's key only), let alone
    set what its proxy injects: a resume body's secrets from it are refused (403), and an owner's only
    fill the values a restarted gateway lost, never replace one the vault holds (that is PATCH's,
    audited as a change)."""
    from corral.gateway.models import ResumeSession
    from corral.gateway.sessions.pausedstate import PausedState

    created = (await _create(world, secrets={"GITHUB_TOKEN": GITHUB})).json()
    session = world.manager.get(created["id"])
    session.state = "paused"
    session.record = session.record.model_copy(update={"paused": PausedState(paused_at=0.0, remaining_s=60.0)})
    async with world.client(created["token"]) as holder:
        refused = await holder.post(f"/v1/sessions/{created['id']}/resume", json={"secrets": {"GITHUB_TOKEN": ROTATED}})
        bare = await holder.post(f"/v1/sessions/{created['id']}/resume", json={})
        paused = await holder.post(f"/v1/sessions/{created['id']}/pause")
    assert refused.status_code == 403, refused.text
    assert bare.status_code == 403 and paused.status_code == 403, (bare.text, paused.text)
    assert session.state == "paused"
    pauses = world.manager.parts.pauses
    assert pauses is not None
    kept = pauses._secrets(session, ResumeSession(secrets={"GITHUB_TOKEN": ROTATED}))
    assert {n: v.get_secret_value() for n, v in kept.values.items()} == {"GITHUB_TOKEN": VALUE}
