"""A Desktop over stand-in parts (no X, no Chromium): each part logs what it was asked to do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from corral.protocol import results as r
from corral.protocol.plan import EncodedImage
from corral.sandbox.desktop import Desktop
from corral.sandbox.settings import ControllerSettings
from corral.sandbox.web.downloadbook import DownloadBook

IMAGE = EncodedImage("image/png", b"\x89PNG-fake", 1280, 800)
STARTED = r.ExecResult(r.ExecStarted(pid=7, background=True))  # what the stand-in process table answers
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


class Parts:
    """What every part was asked, in order: ``(part, method, args)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []
        self.wanted = 0  # the browser's driver asked for in the background (Browser.wanted)

    def log(self, part: str, method: str, *args: Any) -> None:
        self.calls.append((part, method, args))

    def methods(self, part: str) -> list[str]:
        return [method for name, method, _ in self.calls if name == part]


class FakeInput:
    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self._position = (640, 400)

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any, **options: Any) -> Any:
            self._parts.log("input", method, *args, *options.values())
            if method == "move":
                self._position = (args[0], args[1])
            answers = {"spare_keycodes": 8, "on_keymap": True, "bind_for": False, "focused_wm_class": "xterm"}
            return {**answers, "delivered": True}.get(method)

        return call

    def position(self) -> tuple[int, int]:
        return self._position


class FakeScreen:
    width, height = 1280, 800

    def __init__(self, parts: Parts) -> None:
        self._parts = parts

    async def grab(self) -> object:
        self._parts.log("screen", "grab")
        return object()

    async def encode(self, frame: object, fmt: str, **options: Any) -> EncodedImage:
        self._parts.log("screen", "encode", fmt)
        return IMAGE

    def close(self) -> None:
        self._parts.log("screen", "close")


class FakeBrowser:
    loading = False

    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self.downloads = DownloadBook()

    def current_url(self) -> str:
        return "https://page.test/"

    def wanted(self) -> None:
        self._parts.wanted += 1  # not a call on the page: kept apart from the calls logged

    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any) -> dict[str, Any]:
            self._parts.log("browser", method, *args)
            page = {"url": "https://page.test/", "title": f"after {method}"}
            # Each in the shape the real Browser answers it.
            shapes: dict[str, dict[str, Any]] = {
                "navigate": {**page, "status": 200},
                "tabs": {"tabs": [{"index": 0, "id": "t1", "active": True, **page}]},
                "tab_new": {"id": "t1", **page},
                "tab_switch": {"id": "t1", **page},
                "tab_close": {"closed": "t1", "tabs": 0},
            }
            return shapes.get(method, page)

        return call


class FakeProcesses:
    """Stands in for the ProcessTable: logs each process action it is given."""

    def __init__(self, parts: Parts) -> None:
        self._parts = parts

    async def run(self, action: Any, context: Any) -> r.ExecResult:
        self._parts.log("processes", action.type, context.action_id)
        return STARTED


class FakeFiles:
    """Stands in for AgentFiles: logs each file action it is given."""

    def __init__(self, parts: Parts) -> None:
        self._parts = parts

    async def run(self, action: Any) -> r.FileWritten:
        self._parts.log("files", action.type)
        return r.FileWritten(path="/workspace/x", size=0, sha256=EMPTY_SHA256)


class FakeTool:
    """Stands in for the editor, the patcher, the search or the shell: logs each action it is given as ``part``."""

    def __init__(self, parts: Parts, part: str) -> None:
        self._parts = parts
        self._part = part

    async def run(self, action: Any, *context: Any) -> r.ToolOutput:
        self._parts.log(self._part, action.type)
        return r.ToolOutput(output="", path="/workspace/x")


def fake_tools(parts: Parts) -> Any:
    """The editor, the patcher, the search and the shell, as Desktop.open's ``tools`` builds them."""
    return tuple(FakeTool(parts, part) for part in ("editor", "patcher", "search", "shell"))


def fake_desktop(
    parts: Parts, browser: type[FakeBrowser] = FakeBrowser, tools: Callable[[], Any] | None = None
) -> Desktop:
    """A desktop of stand-in parts; with ``tools``, its tools are built by it on first use (as Desktop.open's)."""
    editor, patcher, search, shell = fake_tools(parts) if tools is None else (None, None, None, None)
    return Desktop(
        ControllerSettings(),
        FakeInput(parts),  # type: ignore[arg-type]
        FakeScreen(parts),  # type: ignore[arg-type]
        browser(parts),  # type: ignore[arg-type]
        FakeProcesses(parts),  # type: ignore[arg-type]
        FakeFiles(parts),  # type: ignore[arg-type]
        editor=editor,
        patcher=patcher,
        search=search,
        shell=shell,
        code=FakeTool(parts, "code"),  # type: ignore[arg-type]
        tools=tools,
    )


async def settled(done: Callable[[], bool], turns: int = 1000) -> None:
    """Yields to the loop until ``done()`` (the other tasks reached where the test waits for them)."""
    for _ in range(turns):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("the other tasks never got there")
