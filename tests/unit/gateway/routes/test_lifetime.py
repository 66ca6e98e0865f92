"""A session's lifetime and environment through the API: ``env`` at create (checked whole, given to the
controller before the token, names only in answers, values never), ``PATCH timeout_s`` (the owner's key
only, up to the maximum, followed by the reaper, in the record and the audit chain). Over a fake runtime,
a fake proxy that speaks the control protocol and a fake controller that proves its secret."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from corral.contracts import envvars
from corral.gateway.app import build_sessions
from corral.gateway.sessions import SessionManager

from ..controller_fake import proving
from ..proxy_fake import FakeControlProxy, ProxyState
from .conftest import KEY, OTHER_KEY, client_for, settings_for, wired
from .test_secrets import ProvenRuntime

SECRET_VALUE = "ghp_the-real-value-0123456789"
GITHUB = {"value": SECRET_VALUE, "allow": ["api.example.test"]}
ENV = {"APP_MODE": "staging", "greeting": "hello world", "MULTI": "line one\nline two"}
MAX_TIMEOUT_S = 7200


@dataclass
class EnvController:
    """Every sandbox's controller: what ``PUT /v1/env`` and ``PUT /v1/secrets`` it was sent and holds."""

    env_puts: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (sandbox host, env)
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # sandbox host -> its env
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    env_status: int = 200

    def handle(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.url.path == "/v1/secrets":
            if request.method == "PUT":
                self.secrets[host] = json.loads(request.content)["secrets"]
            return httpx.Response(200, json={"ok": True, "secrets": self.secrets.get(host, {})})
        assert request.url.path == "/v1/env", request.url.path
        if request.method == "PUT":
            if self.env_status >= 300:
                return httpx.Response(self.env_status, json={"ok": False})
            body = json.loads(request.content)
            self.env_puts.append((host, body["env"]))
            self.env[host] = body["env"]
        held = self.env.get(host, {})
        return httpx.Response(200, json={"ok": True, "names": sorted(held), "digest": envvars.digest(held)})


@dataclass
class World:
    app: FastAPI
    manager: SessionManager
    runtime: ProvenRuntime
    proxy: FakeControlProxy
    controller: EnvController
    data_dir: Path

    def client(self, credential: str | None = KEY) -> httpx.AsyncClient:
        return client_for(self.app, credential)

    def proxy_of(self, session_id: str) -> ProxyState:
        assert self.manager.egress is not None
        return self.proxy.state(self.manager.egress.token(session_id))

    def lifetime_ops(self, session_id: str) -> list[dict[str, Any]]:
        return [m for m in self.proxy_of(session_id).messages if m["op"] == "lifetime"]

    def answers_and_files(self, *answers: httpx.Response) -> str:
        return "\n".join(r.text for r in answers)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    settings = settings_for(tmp_path, egress=True, pool_size=0, max_timeout_s=MAX_TIMEOUT_S)
    app = wired(settings)
    runtime = ProvenRuntime()
    proxy, controller = FakeControlProxy(), EnvController()
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


# -- env at create ---------------------------------------------------------------------------------


async def test_env_reaches_the_controller_before_the_token_and_answers_show_names_only(world: World) -> None:
    created = await _create(world, env=ENV)
    assert created.status_code == 201, created.text
    session = created.json()
    host = world.manager.get(session["id"]).sandbox.host
    assert world.controller.env_puts == [(host, ENV)]
    assert session["env"] == sorted(ENV)
    path = f"/v1/sessions/{session['id']}"
    async with world.client() as owner, world.client(session["token"]) as holder:
        shown = [await owner.get(path), await holder.get(path), await owner.get("/v1/sessions")]
    assert shown[0].json()["env"] == sorted(ENV) and shown[2].json()[0]["env"] == sorted(ENV)
    for answer in (created, *shown):
        assert "staging" not in answer.text and "hello world" not in answer.text
    # The record keeps the values (a restarted controller gets them back), in the gateway's 0600 store.
    stored = world.data_dir / "sessions" / f"{session['id']}.json"
    assert json.loads(stored.read_text())["env_values"] == ENV
    assert stored.stat().st_mode & 0o077 == 0
    record = world.manager.get(session["id"]).record
    assert "staging" not in repr(record)
    assert "env" not in record.manifest() and "staging" not in json.dumps(record.manifest())  # the recording's


async def test_a_session_without_env_sends_none(world: World) -> None:
    created = await _create(world)
    assert created.status_code == 201 and created.json()["env"] == []
    assert world.controller.env_puts == []
    stored = json.loads((world.data_dir / "sessions" / f"{created.json()['id']}.json").read_text())
    assert "env" not in stored and "env_values" not in stored  # written as before env existed


@pytest.mark.parametrize(
    ("env", "secrets", "field", "words"),
    [
        ({"PATH": "/tmp/evil"}, {}, "env.PATH", "reserved"),
        ({"HOME": "/tmp"}, {}, "env.HOME", "reserved"),
        ({"http_proxy": "http://evil.invalid"}, {}, "env.http_proxy", "reserved"),
        ({"HTTPS_PROXY": "http://evil.invalid"}, {}, "env.HTTPS_PROXY", "reserved"),
        ({"SSL_CERT_FILE": "/tmp/ca.pem"}, {}, "env.SSL_CERT_FILE", "reserved"),
        ({"CORRAL_PROXY": "x"}, {}, "env.CORRAL_PROXY", "reserved"),
        ({"LD_PRELOAD": "/tmp/x.so"}, {}, "env.LD_PRELOAD", "reserved"),
        ({"1ABC": "x"}, {}, "env.1ABC", "not a digit first"),
        ({"A-B": "x"}, {}, "env.A-B", "A-Z a-z 0-9 _"),
        ({"A" * 129: "x"}, {}, "env." + "A" * 129 + "", "1 to 128"),
        ({"BIG": "x" * (envvars.MAX_VALUE_BYTES + 1)}, {}, "env.BIG", "at most 8192 bytes"),
        ({"NUL": "a\0b"}, {}, "env.NUL", "NUL"),
        ({f"V{i}": "x" for i in range(envvars.MAX_VARS + 1)}, {}, "env", "at most 64"),
        ({f"V{i}": "x" * 8000 for i in range(5)}, {}, "env", "at most 32768"),
        ({"GITHUB_TOKEN": "anything"}, {"GITHUB_TOKEN": GITHUB}, "env.GITHUB_TOKEN", "one of the session's secrets"),
        ({"TOKEN_COPY": SECRET_VALUE}, {"GITHUB_TOKEN": GITHUB}, "env.TOKEN_COPY", "secrets stay brokered"),
        ({"AUTH": f"Bearer {SECRET_VALUE}"}, {"GITHUB_TOKEN": GITHUB}, "env.AUTH", "secrets stay brokered"),
    ],
)
async def test_a_bad_env_is_refused_whole_with_its_field_and_nothing_is_made(
    world: World, env: dict[str, str], secrets: dict[str, Any], field: str, words: str
) -> None:
    refused = await _create(world, env=env, secrets=secrets)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["field"] == field
    assert words in error["message"]
    assert SECRET_VALUE not in refused.text and "x" * 64 not in refused.text and "/tmp/evil" not in refused.text
    assert world.manager.list() == [] and world.runtime.running == {} and world.controller.env_puts == []


async def test_a_controller_that_refuses_the_env_leaves_no_session(world: World) -> None:
    world.controller.env_status = 422
    refused = await _create(world, env=ENV)
    assert refused.status_code >= 500, refused.text
    assert world.manager.list() == [] and world.runtime.running == {}


async def test_the_env_watchdog_gives_a_restarted_controller_its_env_again(world: World) -> None:
    created = (await _create(world, env=ENV)).json()
    host = world.manager.get(created["id"]).sandbox.host
    world.controller.env.pop(host)  # the controller restarted inside its container: it holds none
    await world.manager.reaper.tick()
    assert world.controller.env[host] == ENV and len(world.controller.env_puts) == 2
    await world.manager.reaper.tick()  # held: nothing sent again
    assert len(world.controller.env_puts) == 2


async def test_a_new_secret_that_env_already_shows_is_refused(world: World) -> None:
    created = (await _create(world, env={"DEPLOY_KEY": SECRET_VALUE})).json()
    async with world.client() as owner:
        refused = await owner.patch(f"/v1/sessions/{created['id']}", json={"secrets": {"GITHUB_TOKEN": GITHUB}})
        named = await owner.patch(
            f"/v1/sessions/{created['id']}", json={"secrets": {"DEPLOY_KEY": {**GITHUB, "value": "another-value-1"}}}
        )
    assert refused.status_code == 422 and "secrets stay brokered" in refused.json()["error"]["message"]
    assert refused.json()["error"]["field"] == "env.DEPLOY_KEY"
    assert named.status_code == 422 and "one of the session's secrets" in named.json()["error"]["message"]
    assert SECRET_VALUE not in refused.text
    assert world.proxy_of(created["id"]).secrets_ops() == [] and world.manager.get(created["id"]).record.secrets == {}


# -- PATCH timeout_s --------------------------------------------------------------------------------


async def test_patch_timeout_counts_from_now_and_is_audited_and_stored(world: World) -> None:
    created = (await _create(world, timeout_s=60)).json()
    path = f"/v1/sessions/{created['id']}"
    ops_before = len(world.proxy_of(created["id"]).messages)
    before = time.time()
    async with world.client() as owner:
        changed = await owner.patch(path, json={"timeout_s": 3600})
    assert changed.status_code == 200, changed.text
    expires_at = changed.json()["expires_at"]
    assert before + 3600 <= expires_at <= time.time() + 3600
    assert changed.json()["allow"] == ["api.example.test"]  # the egress is untouched ...
    assert [m["op"] for m in world.proxy_of(created["id"]).messages[ops_before:]] == ["lifetime"]  # ... no policy op
    [op] = world.lifetime_ops(created["id"])
    assert op == {
        "op": "lifetime",
        "actor": "api-key:owner",
        "expires_at": expires_at,
        "previous_expires_at": created["expires_at"],
    }
    [stored] = [r for r in world.manager.book.stored_records() if r.id == created["id"]]
    assert stored.expires_at == expires_at  # a restarted gateway adopts this record


async def test_a_session_extended_past_its_first_expiry_is_not_reaped_and_one_shortened_is(world: World) -> None:
    created = (await _create(world, timeout_s=60)).json()
    path = f"/v1/sessions/{created['id']}"
    lifetimes = world.manager.parts.lifetimes
    async with world.client() as owner:
        lifetimes.clock = lambda: time.time() - 600  # shortened: its new end is already past
        assert (await owner.patch(path, json={"timeout_s": 30})).status_code == 200
        lifetimes.clock = time.time
        assert (await owner.patch(path, json={"timeout_s": 3600})).status_code == 200  # extended again
    await world.manager.reaper.tick()
    assert world.manager.get(created["id"]).state == "ready"

    async with world.client() as owner:
        lifetimes.clock = lambda: time.time() - 600
        assert (await owner.patch(path, json={"timeout_s": 30})).status_code == 200
    await world.manager.reaper.tick()
    session = world.manager.book.find(created["id"])
    assert session is None or session.end_reason == "timeout"
    await world.manager.endings.settled()
    assert world.manager.book.find(created["id"]) is None


async def test_over_the_maximum_is_refused_naming_it_and_nothing_changes(world: World) -> None:
    created = (await _create(world)).json()
    async with world.client() as owner:
        refused = await owner.patch(f"/v1/sessions/{created['id']}", json={"timeout_s": MAX_TIMEOUT_S + 1})
        zero = await owner.patch(f"/v1/sessions/{created['id']}", json={"timeout_s": 0})
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_request", "timeout_s")
    assert f"at most {MAX_TIMEOUT_S}" in error["message"] and "CORRAL_MAX_TIMEOUT_S" in error["message"]
    assert zero.status_code == 422 and zero.json()["error"]["field"] == "timeout_s"
    assert world.manager.get(created["id"]).record.expires_at == created["expires_at"]
    assert world.lifetime_ops(created["id"]) == []


async def test_the_agents_own_token_cannot_change_its_lifetime(world: World) -> None:
    """The attack: the agent holds its session's token and tries to outlive its owner's limit."""
    created = (await _create(world, timeout_s=60)).json()
    path = f"/v1/sessions/{created['id']}"
    async with world.client(created["token"]) as agent, world.client(OTHER_KEY) as other:
        for body in ({"timeout_s": 3600}, {"timeout_s": 3600, "allow": ["evil.invalid"]}, {"env": {"A": "b"}}):
            refused = await agent.patch(path, json=body)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "forbidden"
        assert "owner's API key" in refused.json()["error"]["message"]
        assert (await other.patch(path, json={"timeout_s": 3600})).status_code == 403
    record = world.manager.get(created["id"]).record
    assert record.expires_at == created["expires_at"] and record.allow == ["api.example.test"]
    assert world.lifetime_ops(created["id"]) == []


async def test_env_cannot_be_changed_after_create(world: World) -> None:
    created = (await _create(world, env=ENV)).json()
    async with world.client() as owner:
        refused = await owner.patch(f"/v1/sessions/{created['id']}", json={"env": {"APP_MODE": "prod"}})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "env"
    assert world.controller.env_puts[-1][1] == ENV and len(world.controller.env_puts) == 1


async def test_a_lifetime_change_the_audit_chain_does_not_take_changes_nothing(world: World) -> None:
    created = (await _create(world)).json()
    world.proxy.refuse.add("lifetime")
    async with world.client() as owner:
        refused = await owner.patch(f"/v1/sessions/{created['id']}", json={"timeout_s": 60})
    assert refused.status_code >= 500, refused.text
    assert world.manager.get(created["id"]).record.expires_at == created["expires_at"]


async def test_a_patch_of_egress_and_an_over_long_timeout_changes_neither(world: World) -> None:
    created = (await _create(world)).json()
    proxy = world.proxy_of(created["id"])
    allowed, sent = list(proxy.allow), list(proxy.messages)  # as the create left them
    async with world.client() as owner:
        body = {"allow": ["api.example.test", "other.example.test"], "timeout_s": MAX_TIMEOUT_S + 1}
        refused = await owner.patch(f"/v1/sessions/{created['id']}", json=body)
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "timeout_s"
    record = world.manager.get(created["id"]).record
    assert record.allow == ["api.example.test"] and record.expires_at == created["expires_at"]
    assert proxy.messages == sent and proxy.allow == allowed  # nothing reached the proxy


async def test_a_patch_of_egress_and_timeout_does_both(world: World) -> None:
    created = (await _create(world)).json()
    async with world.client() as owner:
        body = {"allow": ["api.example.test", "other.example.test"], "timeout_s": 120}
        changed = await owner.patch(f"/v1/sessions/{created['id']}", json=body)
    assert changed.status_code == 200, changed.text
    assert changed.json()["allow"] == ["api.example.test", "other.example.test"]
    assert changed.json()["expires_at"] == world.manager.get(created["id"]).record.expires_at
    assert len(world.lifetime_ops(created["id"])) == 1
