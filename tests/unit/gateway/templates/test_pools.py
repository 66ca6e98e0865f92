"""A template's warm pool over the fake runtime: filled from its checked image once it is built,
claimed by a create for it (never by the base's), refilled with the new version after a rebuild,
emptied when the template goes."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.errors import TemplateNotFound
from corral.gateway.app import build_sessions
from corral.gateway.models import CreateSession
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.gateway.templates.builder import TemplateBuilder
from corral.gateway.templates.catalog import TemplateCatalog
from corral.runtime import ImageInfo, SandboxAddress, SandboxSpec

from ...runtime.fake import FakeRuntime
from ..controller_fake import SECRET
from ..test_sessions import REAP_INTERVAL_S, Answered, _controllers

BASE = "corral-desktop:latest"


class Booting(FakeRuntime):
    """Sandboxes that hold their controller's secret, and the image each started from."""

    def __init__(self) -> None:
        super().__init__()
        self.started: dict[str, str] = {}

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        box = dataclasses.replace(super().start_sandbox(spec), secret=SECRET)
        self.running[box.id] = (box, self.running[box.id][1])
        self.started[box.id] = spec.image
        return box


def _tar(text: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        info = tarfile.TarInfo("corral.template.yaml")
        info.size = len(text)
        archive.addfile(info, io.BytesIO(text))
    return out.getvalue()


async def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Yield to the pool's loop until ``predicate`` holds (no clock: the fake runtime answers at once)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 (the pool has no event for "emptied"; this only yields)
            await asyncio.sleep(0)


async def test_a_templates_pool_serves_its_newest_version_only(tmp_path: Path) -> None:
    runtime = Booting()
    runtime.images[BASE] = runtime.images["sha256:base"] = ImageInfo(
        "sha256:base", ("a",), None, None, "root", None, (), (), {}, 1
    )
    settings = GatewaySettings(
        data_dir=tmp_path, instance="t", pool_size=1, pool={"tools": 1}, egress=False, record=False,
        reap_interval_s=REAP_INTERVAL_S, image=BASE,
    )  # fmt: skip
    manager = build_sessions(
        settings, runtime, SessionStore(tmp_path), controller_transport=_controllers(runtime, Answered())
    )
    builder = TemplateBuilder(runtime, TemplateCatalog(tmp_path), BASE, "net")
    await manager.start()
    try:
        pool = manager.templates.pool_for("tools")
        assert pool is not None
        await _until(lambda: len(manager.pool) == 1)
        assert len(pool) == 0  # nothing to fill it with yet: it waits for a build
        first = builder.build(builder.prepare("key-a", "tools", _tar(b"apt: [make]\n"), None), lambda line: None)
        manager.templates.refill("tools")
        await _until(lambda: len(pool) == 1)
        session, _ = await manager.create("key-b", CreateSession(template="tools"))
        assert session.record.from_pool and session.record.template == "tools:1"
        assert runtime.started[session.sandbox.id] == first.version.image_id
        assert len(manager.pool) == 1  # the base's pool was not touched
        await _until(lambda: len(pool) == 1)
        second = builder.build(builder.prepare("key-a", "tools", _tar(b"apt: [gcc]\n"), None), lambda line: None)
        manager.templates.refill("tools")
        await _until(lambda: [runtime.started[p.sandbox.id] for p in pool.pairs()] == [second.version.image_id])
        older, _ = await manager.create("key-b", CreateSession(template="tools:1"))
        assert not older.record.from_pool and runtime.started[older.sandbox.id] == first.version.image_id
        builder.delete("key-a", "tools", None)
        manager.templates.refill("tools")
        await _until(lambda: len(pool) == 0)
        with pytest.raises(TemplateNotFound):
            await manager.create("key-b", CreateSession(template="tools"))
    finally:
        await manager.stop()
