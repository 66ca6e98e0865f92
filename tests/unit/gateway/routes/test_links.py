"""Viewer links over HTTP: made, listed and revoked with the owner's key only; a link opens what the
viewer page reads of its own live session and nothing else; revoked or expired it is told which;
a restarted gateway keeps them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from corral.gateway import auth
from corral.gateway.app import build_sessions
from corral.gateway.models import CreateSession
from corral.gateway.sessions import Session, SessionManager

from .conftest import KEY, KEY_ID_SECRET, OTHER_KEY, client_for, settings_for, wired


@pytest.fixture()
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    app = wired(settings_for(tmp_path, record=True))
    yield app
    await app.state.manager.stop()
    await app.state.http.aclose()


async def _session(app: FastAPI, key: str = KEY) -> tuple[Session, str]:
    manager: SessionManager = app.state.manager
    return await manager.create(auth.key_id(key, KEY_ID_SECRET), CreateSession())


async def _link(app: FastAPI, session: Session, mode: str = "view", **body: Any) -> dict[str, Any]:
    async with client_for(app, KEY) as owner:
        made = await owner.post(f"/v1/sessions/{session.id}/links", json={"mode": mode, **body})
    assert made.status_code == 201, made.text
    return dict(made.json())


def _secret(link: dict[str, Any]) -> str:
    return str(link["url"]).split("#link=", 1)[1]


def _refusal(reply: httpx.Response) -> tuple[int, str, str]:
    return reply.status_code, reply.json()["error"]["code"], reply.json()["error"]["message"]


async def test_the_owner_makes_lists_and_revokes_links(app: FastAPI) -> None:
    session, _ = await _session(app)
    made = await _link(app, session, "control", ttl_s=120)
    assert made["url"].startswith(f"http://gw/v1/sessions/{session.id}/viewer#link=crl_link_")
    assert made["expires_at"] == pytest.approx(made["created_at"] + 120)
    async with client_for(app, KEY) as owner:
        listed = (await owner.get(f"/v1/sessions/{session.id}/links")).json()
        assert listed == [
            {
                "id": made["id"],
                "mode": "control",
                "created_at": made["created_at"],
                "expires_at": made["expires_at"],
                "revoked_at": None,
                "last_used_at": None,
                "streams": 0,
            }
        ]
        revoked = await owner.delete(f"/v1/sessions/{session.id}/links/{made['id']}")
        again = await owner.delete(f"/v1/sessions/{session.id}/links/{made['id']}")
        unknown = await owner.delete(f"/v1/sessions/{session.id}/links/lnk_aaaaaaaaaaaa")
    assert revoked.status_code == 200 and again.json() == revoked.json()  # revoking twice is the same 200
    assert revoked.json() == {"id": made["id"], "revoked_at": pytest.approx(revoked.json()["revoked_at"])}
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
    assert _secret(made) not in (Path(app.state.settings.data_dir) / "sessions" / f"{session.id}.json").read_text()


async def test_only_the_owner_s_key_grants_links(app: FastAPI) -> None:
    session, token = await _session(app)
    link = await _link(app, session)
    path = f"/v1/sessions/{session.id}/links"
    async with (
        client_for(app, token) as agent,
        client_for(app, OTHER_KEY) as other,
        client_for(app, _secret(link)) as viewer,
    ):
        # The agent must not grant itself a human's powers.
        assert _refusal(await agent.post(path, json={"mode": "control"})) == (
            403,
            "forbidden",
            "viewer links are made and revoked with the session owner's API key, not its token",
        )
        assert (await agent.get(path)).status_code == 403
        assert (await agent.delete(f"{path}/{link['id']}")).status_code == 403
        assert (await other.post(path, json={"mode": "view"})).status_code == 403
        assert (await viewer.post(path, json={"mode": "control"})).status_code == 403
    async with client_for(app, KEY) as owner:
        assert (await owner.post(path, json={"mode": "watch"})).status_code == 422
        assert (await owner.post(path, json={"mode": "view", "ttl_s": 86401})).status_code == 422


async def test_a_link_opens_its_session_s_viewer_reads_and_nothing_else(app: FastAPI) -> None:
    session, _ = await _session(app)
    other_session, _ = await _session(app)
    link = await _link(app, session)
    base = f"/v1/sessions/{session.id}"
    link_only = (403, "forbidden", "a viewer link opens only its session's viewer and live stream")
    async with client_for(app, _secret(link)) as viewer:
        events = await viewer.get(f"{base}/recording/events")
        assert events.status_code == 200, events.text
        assert _refusal(await viewer.post(f"{base}/actions", json={"action": {"type": "wait", "ms": 0}})) == link_only
        assert _refusal(await viewer.get(f"{base}/files", params={"path": "/etc/hostname"})) == link_only
        assert _refusal(await viewer.get(base)) == link_only
        assert _refusal(await viewer.get(f"{base}/recording")) == link_only  # the bundle is its owner's
        assert _refusal(await viewer.patch(base, json={"allow": ["x.test"]})) == link_only
        assert _refusal(await viewer.get("/v1/sessions")) == link_only
        foreign = await viewer.get(f"/v1/sessions/{other_session.id}/recording/events")
        assert _refusal(foreign) == (403, "forbidden", "this viewer link is for another session")


async def test_a_link_s_http_read_is_its_use(app: FastAPI) -> None:
    session, _ = await _session(app)
    link = await _link(app, session)
    app.state.manager.links._clock = lambda: 5000.0
    async with client_for(app, _secret(link)) as viewer:
        assert (await viewer.get(f"/v1/sessions/{session.id}/recording/events")).status_code == 200
    await app.state.manager.links.drain()
    async with client_for(app, KEY) as owner:
        listed = (await owner.get(f"/v1/sessions/{session.id}/links")).json()
    assert [x["last_used_at"] for x in listed] == [5000.0]


async def test_a_revoked_or_expired_link_is_refused_naming_which(app: FastAPI) -> None:
    session, _ = await _session(app)
    revoked, expired = await _link(app, session), await _link(app, session, ttl_s=1)
    async with client_for(app, KEY) as owner:
        await owner.delete(f"/v1/sessions/{session.id}/links/{revoked['id']}")
    app.state.manager.links._clock = lambda: expired["expires_at"] + 0.001  # a fake clock: past the expiry
    events = f"/v1/sessions/{session.id}/recording/events"
    async with client_for(app, _secret(revoked)) as first, client_for(app, _secret(expired)) as second:
        assert _refusal(await first.get(events)) == (401, "unauthorized", "link revoked")
        assert _refusal(await second.get(events)) == (401, "unauthorized", "link expired")
    await app.state.manager.links.drain()
    assert app.state.manager.links.get(session.id, expired["id"]).expiry_reported


async def test_a_restarted_gateway_keeps_the_links(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, record=True)
    first = wired(settings)
    await first.state.manager.start()
    session, _ = await _session(first)
    link, revoked = await _link(first, session), await _link(first, session)
    async with client_for(first, KEY) as owner:
        assert (await owner.delete(f"/v1/sessions/{session.id}/links/{revoked['id']}")).status_code == 200
    runtime = first.state.manager.parts.runtime
    await first.state.manager.stop()  # the sandboxes stay; a new gateway adopts them
    await first.state.http.aclose()
    again = wired(settings)
    again.state.manager = build_sessions(settings, runtime, again.state.manager.book.store)
    await again.state.manager.start()
    try:
        kept = again.state.manager.get(session.id).record.links
        assert set(kept) == {link["id"], revoked["id"]} and kept[link["id"]].mode == "view"
        events = f"/v1/sessions/{session.id}/recording/events"
        async with client_for(again, _secret(link)) as viewer:
            assert (await viewer.get(events)).status_code == 200
        async with client_for(again, _secret(revoked)) as viewer:
            assert _refusal(await viewer.get(events)) == (401, "unauthorized", "link revoked")
    finally:
        await again.state.manager.stop()
        await again.state.http.aclose()
