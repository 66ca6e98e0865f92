"""Pause and resume on the session side, against the fake runtime and a stand-in controller (the
narrow seams; the real images are tests/integration/test_pause.py): the slot freed and taken back,
the saved state kept opaque and handed back, the time left carried over, the caps, the expiry, the
idle pause, a failed save, bad states, and a restarted gateway finding a paused session."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.errors import CapacityError, PausedCapacityError, SessionNotPaused
from corral.gateway.app import build_sessions
from corral.gateway.models import CreateSession, ResumeSession
from corral.gateway.sessions import SessionManager
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.runtime import SandboxAddress, SandboxSpec

from ..runtime.fake import FakeRuntime
from .controller_fake import SECRET, proving

REAP_INTERVAL_S = 3600
BANK, NEWS = "https://bank.test/", "https://news.test/"


class ProvenRuntime(FakeRuntime):
    """Sandboxes whose controllers prove the stand-in's secret."""

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        return dataclasses.replace(super().start_sandbox(spec), secret=SECRET)


class Controller:
    """A stand-in controller: two tabs (the first active), a directory as the bytes ``tar`` would
    send, uploads and commands kept as they came."""

    def __init__(self) -> None:
        self.tabs = [(BANK, True), (NEWS, False)]
        self.actions: list[dict[str, Any]] = []
        self.uploads: dict[str, bytes] = {}
        self.refuse_download = False

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(proving(self.answer))

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/files" and request.method == "GET":
            if self.refuse_download:
                return httpx.Response(413, json={"ok": False, "error": {"code": "too_large"}})
            return httpx.Response(200, content=b"tar of " + request.url.params["path"].encode())
        if request.url.path == "/v1/files" and request.method == "PUT":
            self.uploads[request.url.params["path"]] = request.read()
            return httpx.Response(200, json={"ok": True})
        if request.url.path == "/v1/actions":
            action = json.loads(request.read())["action"]
            self.actions.append(action)
            return httpx.Response(200, json={"ok": True, "id": "pause", "result": self._result(action)})
        return httpx.Response(200, json={"ok": True, "secrets": {}})

    def _result(self, action: dict[str, Any]) -> dict[str, Any]:
        if action["type"] == "tabs":
            listed = [
                {"index": i, "id": f"t{i}", "active": a, "url": u, "title": ""} for i, (u, a) in enumerate(self.tabs)
            ]
            return {"tabs": listed}
        if action["type"] == "exec":
            return {"exit_code": 0, "stdout": "1 10\n", "stderr": ""}
        return {"id": f"opened {action.get('url', '')}", "url": action.get("url", ""), "title": ""}


class BrowserStateSpy:
    """The browser-profiles seam as pause and resume call it (BrowserState): what was asked, in order,
    and the bytes an export kept (the real one moves cookies and storage: tests/integration/test_pause.py)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.kept: dict[str, bytes] = {}

    async def export(self, session_id: str, sandbox: SandboxAddress) -> int | None:
        self.calls.append(("export", sandbox.id))
        self.kept[session_id] = b"cookies and storage"
        return len(self.kept[session_id])

    async def restore(self, session_id: str, sandbox: SandboxAddress) -> None:
        self.calls.append(("restore", sandbox.id))

    def discard(self, session_id: str) -> None:
        self.calls.append(("discard", session_id))
        self.kept.pop(session_id, None)

    def state(self, session_id: str) -> bytes | None:
        return self.kept.get(session_id)


def _manager(
    tmp_path: Path, controller: Controller, browser: BrowserStateSpy | None = None, **settings: object
) -> SessionManager:
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "instance": "t",
        "pool_size": 0,
        "reap_interval_s": REAP_INTERVAL_S,
        "egress": False,
        "record": False,
        "max_sessions": 1,
        "max_sessions_per_key": 1,
    }
    values.update(settings)
    runtime = ProvenRuntime()
    return build_sessions(
        GatewaySettings(**values),  # type: ignore[arg-type]
        runtime,
        SessionStore(tmp_path),
        controller_transport=controller.transport(),
        browser_state=browser or BrowserStateSpy(),
    )


async def test_a_pause_frees_the_slot_and_a_resume_gives_the_session_back(tmp_path: Path) -> None:
    controller, browser = Controller(), BrowserStateSpy()
    manager = _manager(tmp_path, controller, browser)
    await manager.start()
    try:
        session, _ = await manager.create("key-a", CreateSession(timeout_s=600))
        old = session.sandbox
        time_left = session.record.expires_at - time.time()
        await manager.pause(session)

        assert session.state == "paused" and session.record.paused is not None
        assert session.record.paused_at == session.record.paused.paused_at
        assert [t.url for t in session.record.paused.tabs] == [BANK, NEWS]
        assert browser.calls == [("export", old.id)]  # the browser's own state, before the sandbox went
        assert session.record.paused.browser_bytes == len(b"cookies and storage")
        saved = tmp_path / "paused" / session.id
        # Kept as the sandbox sent them, never opened: bytes in, the same bytes out.
        assert (saved / "workspace.tar").read_bytes() == b"tar of /workspace"
        assert (saved / "home-agent.tar").read_bytes() == b"tar of /home/agent"
        assert {p.stat().st_mode & 0o777 for p in saved.iterdir()} == {0o600}
        assert saved.stat().st_mode & 0o777 == 0o700
        assert old.id not in manager.parts.runtime.running  # type: ignore[attr-defined]
        assert manager.counts()["ready"] == 0 and manager.counts()["paused"] == 1

        other, _ = await manager.create("key-a", CreateSession())  # the paused one holds no slot
        with pytest.raises(CapacityError):
            await manager.resume(session, ResumeSession())
        assert session.state == "paused"
        await manager.delete(other.id)

        controller.actions.clear()
        await manager.resume(session, ResumeSession())

        assert session.state == "ready" and session.sandbox.id != old.id
        assert session.record.container == session.sandbox.id and session.record.paused is None
        assert abs((session.record.expires_at - time.time()) - time_left) < 5  # the time left, not less
        assert sorted(controller.uploads.values()) == [b"tar of /home/agent", b"tar of /workspace"]
        unpacks = [a["argv"] for a in controller.actions if a["type"] == "exec"]
        assert [argv[:4] for argv in unpacks] == [
            ["/opt/corral/bin/python", "-I", "-m", "corral.sandbox.tools.unpack"]
        ] * 2
        assert sorted(argv[5] for argv in unpacks) == ["/home/agent", "/workspace"]  # restored side by side
        opened = [a["url"] for a in controller.actions if a["type"] == "tab_new"]
        assert opened == [BANK, NEWS]
        switched = [a for a in controller.actions if a["type"] == "tab_switch"]
        assert switched == [{"type": "tab_switch", "tab": f"opened {BANK}"}]  # the one that was active
        closed = [a["tab"] for a in controller.actions if a["type"] == "tab_close"]
        assert closed == ["t0", "t1"]  # the new browser's own tabs (the stand-in lists the same two)
        # Into the new sandbox, then dropped once it resumed (the other session's end dropped nothing of it).
        mine = [call for call in browser.calls[1:] if call[1] in (session.sandbox.id, session.id)]
        assert mine == [("restore", session.sandbox.id), ("discard", session.id)]
        assert not saved.exists()
    finally:
        await manager.stop()


async def test_bad_states_are_refused(tmp_path: Path) -> None:
    manager = _manager(tmp_path, Controller())
    await manager.start()
    try:
        session, _ = await manager.create("key-a", CreateSession())
        with pytest.raises(SessionNotPaused, match="only a paused session resumes"):
            await manager.resume(session, ResumeSession())
        await manager.pause(session)
        with pytest.raises(SessionNotPaused, match="only a running session pauses"):
            await manager.pause(session)
    finally:
        await manager.stop()


async def test_the_paused_cap_refuses_a_pause_and_the_session_runs_on(tmp_path: Path) -> None:
    manager = _manager(tmp_path, Controller(), max_paused=1, max_sessions=2, max_sessions_per_key=2)
    await manager.start()
    try:
        first, _ = await manager.create("key-a", CreateSession())
        second, _ = await manager.create("key-a", CreateSession())
        await manager.pause(first)
        with pytest.raises(PausedCapacityError, match="CORRAL_MAX_PAUSED=1"):
            await manager.pause(second)
        assert second.state == "ready"
    finally:
        await manager.stop()


async def test_a_failed_save_leaves_the_session_running_and_nothing_saved(tmp_path: Path) -> None:
    controller = Controller()
    manager = _manager(tmp_path, controller)
    await manager.start()
    try:
        session, _ = await manager.create("key-a", CreateSession())
        controller.refuse_download = True
        with pytest.raises(Exception, match="413"):
            await manager.pause(session)
        assert session.state == "ready" and not session.ended.is_set()
        assert session.sandbox.id in manager.parts.runtime.running  # type: ignore[attr-defined]
        assert not (tmp_path / "paused" / session.id).exists()
    finally:
        await manager.stop()


async def test_a_paused_session_expires_with_its_saved_state(tmp_path: Path) -> None:
    manager = _manager(tmp_path, Controller(), paused_ttl_s=60)
    await manager.start()
    try:
        session, _ = await manager.create("key-a", CreateSession(timeout_s=1))
        await manager.pause(session)
        await manager.reaper.tick()
        assert session.state == "paused"  # its wall clock stands still while paused (timeout_s=1)
        paused = session.record.paused
        assert paused is not None
        session.record = session.record.model_copy(update={"paused": paused.model_copy(update={"paused_at": 0.0})})
        await manager.reaper.tick()
        await manager.endings.settled()
        assert session.end_reason == "paused_expired"
        assert session.id not in manager.book
        assert not (tmp_path / "paused" / session.id).exists()
    finally:
        await manager.stop()


async def test_an_idle_session_with_idle_action_pause_pauses(tmp_path: Path) -> None:
    manager = _manager(tmp_path, Controller())
    await manager.start()
    try:
        session, _ = await manager.create("key-a", CreateSession(idle_timeout_s=1, idle_action="pause"))
        assert session.record.idle_action == "pause"
        session.last_activity_at -= 10
        await manager.reaper.tick()
        assert manager.parts.pauses is not None
        await manager.parts.pauses.settled()
        assert session.state == "paused" and session.end_reason == ""
    finally:
        await manager.stop()


async def test_a_restarted_gateway_finds_a_paused_session(tmp_path: Path) -> None:
    controller = Controller()
    manager = _manager(tmp_path, controller)
    await manager.start()
    session, _ = await manager.create("key-a", CreateSession())
    await manager.pause(session)
    await manager.stop()

    again = _manager(tmp_path, controller)
    await again.start()
    try:
        found = again.get(session.id)
        assert found.state == "paused" and found.record.paused == session.record.paused
        assert (tmp_path / "paused" / session.id / "workspace.tar").exists()
        await again.resume(found, ResumeSession())
        assert found.state == "ready"
    finally:
        await again.stop()


async def test_a_create_with_a_volume_holds_its_slot_until_its_session_is_in_the_book(tmp_path: Path) -> None:
    """The volume's bind (a lock and a statfs) runs while the create still holds its slot: a second
    create by the same key meanwhile is refused (429), not let past the cap (review of issue 29)."""
    import asyncio

    manager = _manager(tmp_path, Controller())
    await manager.start()
    try:
        await manager.volumes.create("key-a", "work", 16)
        volumes = manager.volumes
        binding, go_on = asyncio.Event(), asyncio.Event()
        bind = volumes.bind

        async def slow_bind(claim: Any, session_id: str) -> Any:
            binding.set()
            await go_on.wait()
            return await bind(claim, session_id)

        volumes.bind = slow_bind  # type: ignore[method-assign]
        first = asyncio.create_task(manager.create("key-a", CreateSession(volume="work")))
        await binding.wait()
        with pytest.raises(CapacityError):
            await manager.create("key-a", CreateSession())
        go_on.set()
        await first
        assert len(manager.list("key-a")) == 1
    finally:
        await manager.stop()


async def test_a_restarted_gateway_removes_saved_state_no_paused_session_owns(tmp_path: Path) -> None:
    """A gateway that died mid-pause (the sandbox removed, the record not yet paused) loses the session
    at its restart; the archives it had saved (the agent's files, its sealed browser state) must not
    stay in the data dir for ever (review of issue 29)."""
    controller = Controller()
    manager = _manager(tmp_path, controller)
    await manager.start()
    session, _ = await manager.create("key-a", CreateSession())
    await manager.pause(session)
    await manager.stop()
    orphan = tmp_path / "paused" / "ses_0123456789abcdef"
    orphan.mkdir(mode=0o700)
    (orphan / "home-agent.tar").write_bytes(b"the agent's files")

    again = _manager(tmp_path, controller)
    await again.start()
    try:
        assert not orphan.exists()
        assert (tmp_path / "paused" / session.id / "workspace.tar").exists()  # a paused session's stays
    finally:
        await again.stop()
