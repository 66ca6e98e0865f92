"""Port previews over HTTP: made, listed and revoked with the owner's key only (the session's own
token: 403), a reserved port refused, the secret shown once in the URL and never in a listing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from corral.gateway import auth
from corral.gateway.models import CreateSession
from corral.gateway.server import build_app, running
from corral.gateway.sessions import Session, SessionManager

from .conftest import KEY, KEY_ID_SECRET, OTHER_KEY, LoopbackRuntime, client_for, closed_port, settings_for, wired


@pytest.fixture()
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    app = wired(settings_for(tmp_path, preview_port=8799, preview_domain="preview.test"))
    yield app
    await app.state.manager.stop()
    await app.state.http.aclose()


async def _session(app: FastAPI) -> tuple[Session, str]:
    manager: SessionManager = app.state.manager
    return await manager.create(auth.key_id(KEY, KEY_ID_SECRET), CreateSession())


async def test_the_owner_makes_lists_and_revokes_a_preview(app: FastAPI) -> None:
    session, _ = await _session(app)
    hexpart = session.id.removeprefix("ses_")
    async with client_for(app, KEY) as owner:
        made = await owner.post(f"/v1/sessions/{session.id}/previews", json={"port": 3000, "ttl_s": 120})
        assert made.status_code == 201, made.text
        preview = made.json()
        assert preview["host"] == f"3000-{hexpart}.preview.test"
        assert preview["url"].startswith(f"http://3000-{hexpart}.preview.test:8799/?corral_preview_token=crl_prev_")
        assert preview["expires_at"] == pytest.approx(preview["created_at"] + 120)
        secret = preview["url"].split("corral_preview_token=", 1)[1]
        listed = await owner.get(f"/v1/sessions/{session.id}/previews")
        assert listed.status_code == 200 and secret not in listed.text
        assert listed.json() == {
            "previews": [
                {
                    "id": preview["id"],
                    "port": 3000,
                    "host": preview["host"],
                    "created_at": preview["created_at"],
                    "expires_at": preview["expires_at"],
                    "revoked_at": None,
                    "last_used_at": None,
                    "connections": 0,
                    "open_connections": 0,
                    "bytes_in": 0,
                    "bytes_out": 0,
                }
            ]
        }
        revoked = await owner.delete(f"/v1/sessions/{session.id}/previews/{preview['id']}")
        again = await owner.delete(f"/v1/sessions/{session.id}/previews/{preview['id']}")
        missing = await owner.delete(f"/v1/sessions/{session.id}/previews/prv_nosuchpreview")
    assert revoked.status_code == 200 and again.json() == revoked.json()
    assert revoked.json()["id"] == preview["id"] and revoked.json()["revoked_at"] >= preview["created_at"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    stored = app.state.manager.get(session.id).record.previews[preview["id"]]
    assert stored.secret_sha256 == auth.digest(secret) and secret not in stored.model_dump_json()


async def test_the_session_token_and_another_key_are_refused(app: FastAPI) -> None:
    session, token = await _session(app)
    base = f"/v1/sessions/{session.id}/previews"
    async with client_for(app, token) as agent:
        made = await agent.post(base, json={"port": 3000})
        listed = await agent.get(base)
        revoked = await agent.delete(f"{base}/prv_x")
    for answer in (made, listed, revoked):
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden", answer.text
        assert "owner's API key" in answer.json()["error"]["message"]
    async with client_for(app, OTHER_KEY) as other:
        assert (await other.post(base, json={"port": 3000})).status_code == 403
    async with client_for(app) as nobody:
        assert (await nobody.post(base, json={"port": 3000})).status_code == 401


@pytest.mark.parametrize("port", [8765, 9222, 8701, 0, 65536])
async def test_a_port_no_preview_may_reach_is_refused(app: FastAPI, port: int) -> None:
    session, _ = await _session(app)
    async with client_for(app, KEY) as owner:
        answer = await owner.post(f"/v1/sessions/{session.id}/previews", json={"port": port})
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "port", answer.text


async def test_previews_off_are_said_so(tmp_path: Path) -> None:
    app = wired(settings_for(tmp_path, preview_port=0))
    try:
        manager: SessionManager = app.state.manager
        session, _ = await manager.create(auth.key_id(KEY, KEY_ID_SECRET), CreateSession())
        async with client_for(app, KEY) as owner:
            answer = await owner.post(f"/v1/sessions/{session.id}/previews", json={"port": 3000})
        assert answer.status_code == 404 and "CORRAL_PREVIEW_PORT" in answer.json()["error"]["message"]
    finally:
        await app.state.manager.stop()
        await app.state.http.aclose()


async def test_the_api_reads_no_cookie_whatever_it_holds(app: FastAPI) -> None:
    """A page served on a preview's origin can make a browser send cookies, never headers, to the API:
    the API takes its credentials from headers only, so a cookie holding a key opens nothing."""
    session, token = await _session(app)
    cookies = f"corral_preview_x={KEY}; token={token}; authorization=Bearer%20{KEY}; key={KEY}"
    async with client_for(app) as browser:
        listed = await browser.get("/v1/sessions", headers={"cookie": cookies})
        made = await browser.post(
            f"/v1/sessions/{session.id}/previews", json={"port": 3000}, headers={"cookie": cookies}
        )
    assert listed.status_code == 401 and made.status_code == 401


def test_the_served_gateway_answers_previews_on_their_own_port_only(tmp_path: Path) -> None:
    """The preview listener serves no API (whatever the credential), and the API's port no preview."""
    settings = settings_for(tmp_path, port=closed_port(), preview_domain="localhost")
    with running(settings, app=build_app(settings, runtime=LoopbackRuntime())) as url:
        preview_base = f"http://127.0.0.1:{settings.preview_port}"
        api = httpx.get(f"{url}/v1/health")
        on_previews = httpx.get(f"{preview_base}/v1/health", headers={"authorization": f"Bearer {KEY}"})
        unknown = httpx.get(f"{preview_base}/", headers={"host": "3000-0123abcd.localhost", "accept": "text/html"})
        preview_on_api = httpx.get(f"{url}/", headers={"host": "3000-0123abcd.localhost"})
    assert api.status_code == 200 and "sessions" in api.json()
    assert on_previews.status_code == 404 and on_previews.json()["error"]["code"] == "not_found"
    assert "no preview at" in on_previews.json()["error"]["message"]
    assert unknown.status_code == 410 and unknown.headers["content-type"].startswith("text/html")
    assert b"preview_gone" in unknown.content
    assert preview_on_api.status_code == 404 and "3000" not in preview_on_api.text
