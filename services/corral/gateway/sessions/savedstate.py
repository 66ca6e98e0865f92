"""A paused session's state moved out of its sandbox and back into the next one, through the
controller only: its tabs (the ``tabs`` action; ``tab_new``/``tab_switch`` to restore them), and
its directories as tar archives made by tar run as the agent (``GET /v1/files`` on a directory),
kept on the host as opaque blobs (0600 in a 0700 directory of the data dir) that the host never
opens, put back by uploading the blob and unpacking it inside the new sandbox as the agent
(corral.sandbox.tools.unpack, which refuses links out, absolute and ``..`` paths, devices, and more
than the cap). The browser's own state (cookies, storage) goes through :class:`BrowserState`
(corral.gateway.sessions.pausedbrowser, on the browser-profiles seam)."""

from __future__ import annotations

import logging
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx

from corral.errors import SandboxUnreachable
from corral.gateway import controller
from corral.gateway.sessions.controllers import Controllers
from corral.gateway.sessions.pausedstate import PausedTab
from corral.gateway.store import private_dir, private_file
from corral.runtime import SandboxAddress

log = logging.getLogger(__name__)

CONTROLLER_FILES = "/v1/files"
UNPACKER = ["/opt/corral/bin/python", "-I", "-m", "corral.sandbox.tools.unpack"]
CHUNK = 1 << 20
ARCHIVE_TIMEOUT_S = 600.0
TABS_DEADLINE_S = 60.0  # every saved tab reopened within this, together
TAB_LOAD_S = 20.0  # one tab's load, at most


class BrowserState(Protocol):
    """The seam where pause and resume save and give back the browser's own state (cookies, local
    storage): the browser-profiles part's export/import. ``export`` returns the bytes it saved."""

    async def export(self, session_id: str, sandbox: SandboxAddress) -> int | None: ...

    async def restore(self, session_id: str, sandbox: SandboxAddress) -> None: ...

    def discard(self, session_id: str) -> None: ...

    def state(self, session_id: str) -> bytes | None:
        """What ``export`` kept (a profile saved at a paused session's end is that), or None."""
        ...


def blob_name(directory: str) -> str:
    """``/home/agent`` -> ``home-agent.tar``."""
    return directory.strip("/").replace("/", "-") + ".tar"


class SavedState:
    def __init__(self, root: Path, controllers: Controllers, max_bytes: int) -> None:
        self.root = root  # <data_dir>/paused: one 0700 directory per paused session
        self._controllers = controllers
        self.max_bytes = max_bytes

    def directory(self, session_id: str) -> Path:
        return self.root / session_id

    def remove(self, session_id: str) -> None:
        shutil.rmtree(self.directory(session_id), ignore_errors=True)

    def sweep(self, paused: set[str]) -> list[str]:
        """At a gateway's start: every directory no paused session owns (a gateway that died mid-pause
        lost its session, not its archives) removed; the ids removed."""
        if not self.root.is_dir():
            return []
        gone = [entry.name for entry in self.root.iterdir() if entry.name not in paused]
        for name in gone:
            self.remove(name)
        return gone

    async def act(self, sandbox: SandboxAddress, action: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        """One native action on the controller; its result, or SandboxUnreachable saying why not."""
        try:
            response = await controller.request(
                self._controllers.http,
                sandbox.base_url,
                sandbox.secret,
                "POST",
                "/v1/actions",
                json={"id": "pause", "action": action},
                timeout=timeout_s,
            )
            reply = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise SandboxUnreachable(f"{action['type']} on {sandbox.name}: {exc}") from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else None
            raise SandboxUnreachable(f"{action['type']} on {sandbox.name} failed: {error}")
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    async def tabs(self, sandbox: SandboxAddress) -> list[PausedTab]:
        listed = (await self.act(sandbox, {"type": "tabs"})).get("tabs") or []
        return [PausedTab(url=str(t.get("url", "")), active=bool(t.get("active"))) for t in listed][:256]

    async def open_tabs(self, sandbox: SandboxAddress, tabs: list[PausedTab]) -> None:
        """The saved tabs opened in order, the blank ones the new browser started with closed, the
        active one in front. A page that no longer loads leaves its tab at its address, as a browser would."""
        if not tabs:
            return
        before = (await self.act(sandbox, {"type": "tabs"})).get("tabs") or []
        opened: list[str] = []
        # One deadline for them all: a resume holds the session's lock (a DELETE waits on it) and a
        # slot, and a page (an attacker's, too) may never finish loading; what is left past it stays shut.
        deadline = time.monotonic() + TABS_DEADLINE_S
        for index, tab in enumerate(tabs):
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning(
                    "resume: %d of %d tabs not reopened within %.0f s", len(tabs) - index, len(tabs), TABS_DEADLINE_S
                )
                break
            try:
                shown = await self.act(sandbox, {"type": "tab_new", "url": tab.url}, min(left, TAB_LOAD_S))
            except SandboxUnreachable as exc:
                log.warning("resume: tab %s did not load: %s", tab.url[:200], exc)
                shown = await self.act(sandbox, {"type": "tab_new"})
            opened.append(str(shown.get("id", "")))
        if not opened:
            return
        for old in before:
            await self.act(sandbox, {"type": "tab_close", "tab": str(old.get("id"))})
        active = next((i for i, t in enumerate(tabs) if t.active), len(tabs) - 1)
        await self.act(sandbox, {"type": "tab_switch", "tab": opened[min(active, len(opened) - 1)]})

    async def save_dir(self, session_id: str, sandbox: SandboxAddress, path: str) -> int:
        """``path`` as the tar the agent's tar makes, into the session's blob; its size. Past the cap
        the pause fails (the controller refuses by ``du``, this by counting)."""
        target = private_dir(self.directory(session_id)) / blob_name(path)
        size = 0
        params = {"path": path, "max_bytes": str(self.max_bytes)}
        try:
            async with controller.stream(
                self._controllers.http,
                sandbox.base_url,
                sandbox.secret,
                "GET",
                CONTROLLER_FILES,
                params=params,
                timeout=ARCHIVE_TIMEOUT_S,
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise SandboxUnreachable(
                        f"saving {path}: the sandbox answered {response.status_code}: {response.text[:300]}"
                    )
                with private_file(target, None) as out:
                    async for chunk in response.aiter_bytes(CHUNK):
                        size += len(chunk)
                        if size > self.max_bytes:
                            raise SandboxUnreachable(f"saving {path}: more than {self.max_bytes} bytes")
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"saving {path}: {exc}") from None
        return size

    async def restore_dir(self, session_id: str, sandbox: SandboxAddress, path: str) -> None:
        """The blob uploaded into the new sandbox as the agent and unpacked there, as the agent."""
        blob = self.directory(session_id) / blob_name(path)
        if not blob.exists():
            return
        upload = f"/tmp/.corral-restore-{secrets.token_hex(6)}.tar"
        try:
            response = await controller.request(
                self._controllers.http,
                sandbox.base_url,
                sandbox.secret,
                "PUT",
                CONTROLLER_FILES,
                params={"path": upload},
                content=_read(blob),
                # The guard takes raw bytes on this route only, as such; the length says a cut body is one.
                headers={"content-type": "application/octet-stream", "content-length": str(blob.stat().st_size)},
                timeout=ARCHIVE_TIMEOUT_S,
            )
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"restoring {path}: {exc}") from None
        if response.status_code >= 300:
            raise SandboxUnreachable(
                f"restoring {path}: the sandbox answered {response.status_code}: {response.text[:300]}"
            )
        argv = [*UNPACKER, upload, path, str(self.max_bytes)]
        result = await self.act(sandbox, {"type": "exec", "argv": argv, "cwd": "/"}, timeout_s=ARCHIVE_TIMEOUT_S)
        if result.get("exit_code") != 0:
            raise SandboxUnreachable(f"restoring {path}: {str(result.get('stderr') or result)[:500]}")


async def _read(path: Path) -> AsyncIterator[bytes]:
    async with await anyio.open_file(path, "rb") as blob:
        while chunk := await blob.read(CHUNK):
            yield chunk
