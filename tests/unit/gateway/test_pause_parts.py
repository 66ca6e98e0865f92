"""Pause and resume across the other parts of issue 29, on the session side over the fake runtime and
a stand-in controller (the real images are tests/integration/test_pause.py): a session started from a
template resumes from its image, and one whose template was deleted meanwhile is refused naming it,
still paused with nothing started; a session's env is given to the new controller at its resume."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from corral.contracts import envvars
from corral.errors import TemplateNotFound
from corral.gateway.app import build_sessions
from corral.gateway.models import CreateSession, ResumeSession
from corral.gateway.routes.errors import answer_for
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.gateway.templates.builder import TemplateBuilder
from corral.gateway.templates.catalog import TemplateCatalog
from corral.runtime import ImageInfo

from .templates.test_pools import BASE, Booting, _tar
from .test_pausing import REAP_INTERVAL_S, BrowserStateSpy, Controller, _manager

ENV = {"APP_MODE": "staging", "MULTI": "line one\nline two"}


class EnvController(Controller):
    """The stand-in controller, also keeping every ``PUT /v1/env`` (by the sandbox's address) and
    answering ``GET /v1/env`` with the digest of what that sandbox holds."""

    def __init__(self) -> None:
        super().__init__()
        self.env_puts: list[tuple[str, dict[str, str]]] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/env":
            return super().answer(request)
        host = request.url.host
        if request.method == "PUT":
            self.env_puts.append((host, json.loads(request.content)["env"]))
        held = next((env for at, env in reversed(self.env_puts) if at == host), {})
        return httpx.Response(200, json={"ok": True, "names": sorted(held), "digest": envvars.digest(held)})


async def test_a_resume_starts_from_the_template_and_refuses_one_deleted_naming_it(tmp_path: Path) -> None:
    runtime = Booting()
    runtime.images[BASE] = runtime.images["sha256:base"] = ImageInfo(
        "sha256:base", ("a",), None, None, "root", None, (), (), {}, 1
    )
    settings = GatewaySettings(
        data_dir=tmp_path, instance="t", pool_size=0, egress=False, record=False,
        reap_interval_s=REAP_INTERVAL_S, image=BASE,
    )  # fmt: skip
    controller = Controller()
    manager = build_sessions(
        settings,
        runtime,
        SessionStore(tmp_path),
        controller_transport=controller.transport(),
        browser_state=BrowserStateSpy(),
    )
    builder = TemplateBuilder(runtime, TemplateCatalog(tmp_path), BASE, "net")
    await manager.start()
    try:
        built = builder.build(builder.prepare("key-a", "tools", _tar(b"apt: [make]\n"), None), lambda line: None)
        session, _ = await manager.create("key-a", CreateSession(template="tools"))
        assert session.record.template == "tools:1"
        await manager.pause(session)
        await manager.resume(session, ResumeSession())
        assert runtime.started[session.sandbox.id] == built.version.image_id  # its template's, not the base

        await manager.pause(session)
        builder.delete("key-a", "tools", None)
        manager.templates.refill("tools")
        started = len(runtime.specs)
        with pytest.raises(TemplateNotFound, match=r"^no template tools:1$") as refused:
            await manager.resume(session, ResumeSession())

        assert answer_for(refused.value).status == 404
        assert session.state == "paused" and session.record.paused is not None
        assert len(runtime.specs) == started and not runtime.running  # nothing started, nothing left
        assert (tmp_path / "paused" / session.id / "workspace.tar").exists()  # its state kept for a later try
        assert manager.counts()["paused"] == 1
    finally:
        await manager.stop()


async def test_a_resume_gives_the_new_controller_the_sessions_env(tmp_path: Path) -> None:
    controller = EnvController()
    manager = _manager(tmp_path, controller)
    await manager.start()
    try:
        session, _ = await manager.create("key-a", CreateSession(env=ENV))
        first = session.sandbox
        assert controller.env_puts == [(first.host, ENV)]
        await manager.pause(session)
        await manager.resume(session, ResumeSession())

        assert session.sandbox.host != first.host
        assert controller.env_puts == [(first.host, ENV), (session.sandbox.host, ENV)]
        await manager.reaper.tick()  # its env watchdog finds the new controller holding it: nothing again
        assert len(controller.env_puts) == 2
    finally:
        await manager.stop()
