"""What changes a running session refuses while it is paused: ``PATCH /v1/sessions/{id}`` (its
``timeout_s`` or ``allow``: its proxy is stopped) and ``POST /v1/sessions/{id}/profile/save`` (its
sandbox is gone) answer 409 ``session_paused`` and change nothing; the same calls after the resume
work. A paused session's end saves its profile from the state its pause exported, and one whose
sealed browser state does not open (another CORRAL_PROFILE_KEY since, or damaged) still ends. Over a
fake runtime, a fake proxy that speaks the control protocol and a stand-in controller."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from corral.errors import ProfileUnreadable
from corral.gateway.app import build_sessions
from corral.gateway.sessions import SessionManager

from ..proxy_fake import FakeControlProxy, ProxyState
from ..test_pausing import BrowserStateSpy, Controller, ProvenRuntime
from .conftest import KEY, client_for, settings_for, wired

PROFILE_KEY = "profile-key-Vw3nQ8zR1tY6uK0pL5sD9fG2hJ4xC7bM"


class UnreadableLater(BrowserStateSpy):
    """The seam, whose kept state stops opening when ``unreadable`` (as PausedBrowser.state does for a
    blob sealed under another profile key); every read counted."""

    def __init__(self) -> None:
        super().__init__()
        self.unreadable = False
        self.reads = 0

    def state(self, session_id: str) -> bytes | None:
        self.reads += 1
        if self.unreadable:
            raise ProfileUnreadable("saved profile does not decrypt: saved under another CORRAL_PROFILE_KEY")
        return super().state(session_id)


@dataclass
class World:
    app: FastAPI
    manager: SessionManager
    proxy: FakeControlProxy
    browser: UnreadableLater
    data_dir: Path

    def client(self) -> httpx.AsyncClient:
        return client_for(self.app, KEY)

    def proxy_of(self, session_id: str) -> ProxyState:
        assert self.manager.egress is not None
        return self.proxy.state(self.manager.egress.token(session_id))


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    settings = settings_for(tmp_path, egress=True, pool_size=0, max_timeout_s=7200, profile_key=PROFILE_KEY)
    app = wired(settings)
    proxy, controller, browser = FakeControlProxy(), Controller(), UnreadableLater()
    store = app.state.manager.book.store
    manager = app.state.manager = build_sessions(
        settings,
        ProvenRuntime(),
        store,
        controller_transport=controller.transport(),
        browser_state=browser,
    )
    await proxy.start()
    await manager.start()
    assert manager.egress is not None
    manager.egress.control_port = proxy.port
    try:
        yield World(app, manager, proxy, browser, tmp_path)
    finally:
        await manager.stop()
        await app.state.http.aclose()
        proxy.close()


async def _paused(world: World, profile: bool = True) -> str:
    body: dict[str, object] = {"allow": ["api.example.test"], "timeout_s": 600}
    if profile:
        body["profile"] = {"name": "work", "save": True}
    async with world.client() as owner:
        created = await owner.post("/v1/sessions", json=body)
        assert created.status_code == 201, created.text
        session_id = str(created.json()["id"])
        paused = await owner.post(f"/v1/sessions/{session_id}/pause")
        assert paused.status_code == 200, paused.text
    return session_id


@pytest.mark.parametrize("change", [{"timeout_s": 3600}, {"allow": ["api.example.test", "more.example.test"]}])
async def test_a_paused_sessions_patch_is_refused_and_changes_nothing(world: World, change: dict[str, object]) -> None:
    session_id = await _paused(world)
    session = world.manager.get(session_id)
    record, sent = session.record, len(world.proxy_of(session_id).messages)
    async with world.client() as owner:
        refused = await owner.patch(f"/v1/sessions/{session_id}", json=change)
        shown = (await owner.get(f"/v1/sessions/{session_id}")).json()

    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "session_paused"
    assert f"POST /v1/sessions/{session_id}/resume" in refused.json()["error"]["message"]
    assert session.record == record and session.state == "paused"
    assert len(world.proxy_of(session_id).messages) == sent  # nothing reached its (stopped) proxy
    assert shown["allow"] == ["api.example.test"] and shown["expires_at"] == record.expires_at

    async with world.client() as owner:
        assert (await owner.post(f"/v1/sessions/{session_id}/resume", json={})).status_code == 200
        taken = await owner.patch(f"/v1/sessions/{session_id}", json=change)
    assert taken.status_code == 200, taken.text  # the same change once it runs again


async def test_a_paused_sessions_profile_save_is_refused_and_saves_nothing(world: World) -> None:
    session_id = await _paused(world)
    session = world.manager.get(session_id)
    profiles = world.manager.profiles
    assert profiles is not None
    before = profiles.store.list(session.owner)
    async with world.client() as owner:
        refused = await owner.post(f"/v1/sessions/{session_id}/profile/save")

    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "session_paused"
    assert profiles.store.list(session.owner) == before == []
    assert session.state == "paused" and session.record.paused is not None


async def test_a_paused_session_whose_browser_state_does_not_open_still_ends(world: World) -> None:
    session_id = await _paused(world)
    session = world.manager.get(session_id)
    paused_dir = world.data_dir / "paused" / session_id
    assert paused_dir.is_dir()
    world.browser.unreadable = True
    async with world.client() as owner:
        ended = await owner.delete(f"/v1/sessions/{session_id}")
        gone = await owner.get(f"/v1/sessions/{session_id}")

    assert ended.status_code == 204, ended.text
    assert gone.status_code == 404 and session_id not in world.manager.book
    assert session.removed.is_set() and not paused_dir.exists()
    assert world.manager.profiles is not None and world.manager.profiles.store.list(session.owner) == []


async def test_a_paused_session_without_a_profile_to_save_never_reads_its_browser_state_at_its_end(
    world: World,
) -> None:
    session_id = await _paused(world, profile=False)
    world.browser.unreadable = True
    async with world.client() as owner:
        ended = await owner.delete(f"/v1/sessions/{session_id}")
    assert ended.status_code == 204, ended.text
    assert world.browser.reads == 0  # its sealed live credentials are not opened for nothing


async def test_a_paused_sessions_end_saves_its_profile_from_the_state_its_pause_exported(world: World) -> None:
    session_id = await _paused(world)
    session = world.manager.get(session_id)
    kept = world.browser.kept[session_id]
    async with world.client() as owner:
        ended = await owner.delete(f"/v1/sessions/{session_id}")

    assert ended.status_code == 204, ended.text
    profiles = world.manager.profiles
    assert profiles is not None
    assert profiles.store.load(session.owner, "work") == kept  # its sandbox was gone: the paused state is the profile
    assert world.browser.reads == 1 and session_id not in world.browser.kept  # read once, then discarded
