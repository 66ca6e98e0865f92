"""``/v1/sessions``: credentials before bodies, capped bodies, errors that name their field, who may
see and change what, and the session as the API shows it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from corral.gateway.models import SessionOut
from corral.gateway.sessions import SessionManager

from .conftest import KEY, OTHER_KEY, Client, client_for, settings_for, wired


class CountingBody:
    """A request body that counts what the server pulled of it."""

    def __init__(self, chunks: int, size: int = 1 << 20) -> None:
        self.chunks, self.size, self.pulled = chunks, size, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.pulled += 1
            yield b" " * self.size


async def test_an_unauthenticated_body_is_refused_unread(client: Client) -> None:
    body = CountingBody(200)  # 200 MiB, announced
    async with client() as anon:
        reply = await anon.post("/v1/sessions", content=body, headers={"content-length": str(200 << 20)})
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "unauthorized"
    assert body.pulled == 0
    assert reply.headers["connection"] == "close"  # and the server takes in none of the rest


async def test_an_authenticated_body_over_the_cap_is_refused_before_parsing(app: FastAPI, client: Client) -> None:
    announced = CountingBody(200)
    async with client(KEY) as owner:
        reply = await owner.post("/v1/sessions", content=announced, headers={"content-length": str(200 << 20)})
        assert reply.status_code == 413 and reply.json()["error"]["code"] == "message_too_large"
        assert announced.pulled == 0  # the Content-Length said enough
        streamed = CountingBody(200, size=16 << 10)  # chunked, no length: cut once past 64 KiB
        reply = await owner.post("/v1/sessions", content=streamed)
        assert reply.status_code == 413 and streamed.pulled == 5
        assert app.state.manager.list() == []


async def test_bodies_under_the_cap_still_validate_with_their_field(client: Client) -> None:
    async with client(KEY) as owner:
        bad = await owner.post("/v1/sessions", json={"viewport": {"width": 10}})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "viewport.width"
        assert (await owner.post("/v1/sessions", content=b"{nope")).status_code == 422
        created = await owner.post("/v1/sessions", json={"labels": {"a": "b"}})
        assert created.status_code == 201 and created.json()["labels"] == {"a": "b"}
        patched = await owner.patch(f"/v1/sessions/{created.json()['id']}", json={"colour": "red"})
        assert patched.status_code == 422 and patched.json()["error"]["field"] == "colour"


async def test_a_refused_create_names_the_field_to_blame(client: Client) -> None:
    async with client(KEY) as owner:
        too_long = await owner.post("/v1/sessions", json={"timeout_s": 10**9})
        hermetic = await owner.post("/v1/sessions", json={"hermetic": "rsp_0123456789abcdef"})
    assert too_long.status_code == 422
    assert too_long.json() == {
        "ok": False,
        "error": {"code": "invalid_request", "message": "timeout_s is at most 86400", "field": "timeout_s"},
    }
    # This gateway runs without egress control: a hermetic replay cannot be had, and the field says which.
    assert hermetic.status_code == 409
    assert (hermetic.json()["error"]["code"], hermetic.json()["error"]["field"]) == ("egress_off", "hermetic")


async def test_the_caps_answer_429_at_once(tmp_path: Path) -> None:
    app = wired(settings_for(tmp_path, max_sessions_per_key=1))
    async with client_for(app, KEY) as owner:
        assert (await owner.post("/v1/sessions", json={})).status_code == 201
        refused = await owner.post("/v1/sessions", json={})
    await app.state.http.aclose()
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_sessions"
    assert "this API key" in refused.json()["error"]["message"]


async def test_sessions_are_their_owners_only(app: FastAPI, client: Client) -> None:
    async with client(KEY) as owner, client(OTHER_KEY) as other:
        created = (await owner.post("/v1/sessions", json={})).json()
        path = f"/v1/sessions/{created['id']}"
        assert [s["id"] for s in (await owner.get("/v1/sessions")).json()] == [created["id"]]
        assert (await other.get("/v1/sessions")).json() == []
        assert (await other.get(path)).status_code == 403
        assert (await other.delete(path)).status_code == 403
        assert (await other.patch(path, json={"allow": []})).status_code == 403
        async with client(created["token"]) as holder:
            assert (await holder.get(path)).status_code == 200
            assert (await holder.post("/v1/sessions", json={})).status_code == 401  # a token is no API key
            refused = await holder.patch(path, json={"allow": ["example.com"]})
            assert refused.status_code == 403 and "owner's API key" in refused.json()["error"]["message"]
        assert (await owner.delete(path)).status_code == 204
        gone = await owner.get(path)
    assert gone.status_code == 404 and gone.json()["error"] == {
        "code": "not_found",
        "message": f"no session {created['id']}",
    }
    manager: SessionManager = app.state.manager
    assert manager.list() == []


async def test_the_session_as_the_api_shows_it(client: Client) -> None:
    async with client(KEY) as owner:
        created = (await owner.post("/v1/sessions", json={"allow": ["example.com"], "labels": {"run": "1"}})).json()
        shown = (await owner.get(f"/v1/sessions/{created['id']}")).json()
    assert created.keys() - shown.keys() == {"token"}
    assert set(shown) == set(SessionOut.model_fields)
    assert shown["ws_url"] == f"ws://gw/v1/sessions/{created['id']}/ws"
    assert shown["actions_url"] == f"http://gw/v1/sessions/{created['id']}/actions"
    assert shown["traffic_url"] == f"http://gw/v1/sessions/{created['id']}/traffic"
    assert (shown["allow"], shown["labels"], shown["state"]) == (["example.com"], {"run": "1"}, "ready")
    assert "token_sha256" not in shown and "owner" not in shown


@pytest.mark.parametrize("method", ["get", "delete"])
async def test_an_unknown_session_is_404_for_a_key_and_401_for_nobody(client: Client, method: str) -> None:
    async with client(KEY) as owner, client("nope") as stranger:
        assert (await getattr(owner, method)("/v1/sessions/ses_0000000000000000")).status_code == 404
        assert (await getattr(stranger, method)("/v1/sessions/ses_0000000000000000")).status_code == 401
