"""The controller keeps a page open in Chromium, so no page can quit it (docs/design/0384).

Headful Chromium quits with its last window, and a page may close its own tab (``window.close()`` in
a tab a link opened), so a page could quit it once the agent closed the others: every tab, cookie and
CDP client lost. Chromium is therefore started with ``--no-startup-window`` beside its remote
debugging port (corral.sandbox.startup.init), which keeps it running without any window until
``Browser.close`` (a CDP client's is answered by the relay: corral.contracts.cdprules). This watch,
on a CDP connection of the controller's own (made again after Chromium restarts), opens the first
page at start and a blank one whenever the last page closes, so the screen and the agent's actions
always find a page.

While the browser's state is exported (corral.sandbox.web.stateswap, its lock held exclusively), the
export closes Chromium's windows to quit it in full; the last page gone then, this watch asks
Chromium over CDP to close (``Browser.close``: a full shutdown, its cookie store and local storage
committed), which the export's uid cannot (the firewall keeps it off DevTools).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from corral.errors import ActionError
from corral.sandbox.web import cdp

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

log = logging.getLogger(__name__)

RETRY_S: Final = 0.5  # between attempts to reach Chromium (booting, restarting), at most
# The first retry after Chromium was last reached (or at boot), doubled up to RETRY_S: the controller
# may come up before Chromium's DevTools listen, and /healthz waits for this watch's first page, so a
# whole RETRY_S slept there was added to a cold start. A refused connection on loopback costs nothing.
FIRST_RETRY_S: Final = 0.025
MAX_EVENT_BYTES: Final = 1 << 20
BROWSER_LOCK: Final = "/run/corral/browser.lock"  # corral.sandbox.web.stateswap's LOCK_FILE
_DISCOVER = {"discover": True}


class PageCount:
    """The page targets Chromium reports, from its ``Target`` events. Pure."""

    def __init__(self) -> None:
        self.pages: set[str] = set()

    def event(self, method: object, params: dict[str, object]) -> bool:
        """Take one event; True when it closed the last page."""
        info = params.get("targetInfo")
        if method in ("Target.targetCreated", "Target.targetInfoChanged") and isinstance(info, dict):
            target = info.get("targetId")
            if isinstance(target, str) and info.get("type") == "page":
                self.pages.add(target)
            return False
        if method == "Target.targetDestroyed":
            target = params.get("targetId")
            if isinstance(target, str) and target in self.pages:
                self.pages.discard(target)
                return not self.pages
        return False


def swap_under_way(lock_file: str = BROWSER_LOCK) -> bool:
    """Whether the browser's state is being exported or imported (its lock held exclusively)."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no uid split: no export either
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # a shared lock taken is let go with it
    return False


def next_retry(last_s: float, reached: bool, first_s: float = FIRST_RETRY_S, most_s: float = RETRY_S) -> float:
    """The pause before the next attempt: ``first_s`` after a connection that was made (Chromium
    restarting) or the first failure, else twice the last, up to ``most_s``."""
    return first_s if reached else min(max(last_s * 2, first_s), most_s)


class PageKeeper:
    """The watch's task (:meth:`start`, :meth:`close`); ``kept`` is set while Chromium has a page."""

    def __init__(
        self,
        cdp_url: str,
        open_blank: Callable[[], Awaitable[None]],
        swapping: Callable[[], bool] = swap_under_way,
        retry_s: float = RETRY_S,
    ) -> None:
        self._cdp_url, self._open_blank, self._swapping, self._retry_s = cdp_url, open_blank, swapping, retry_s
        self._task: asyncio.Task[None] | None = None
        self._opening: asyncio.Task[None] | None = None
        self._count = PageCount()
        self._reached = False  # the current attempt connected to Chromium
        self.kept = asyncio.Event()
        self.opened = 0  # blank pages opened so far (logs, tests)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        tasks = [t for t in (self._task, self._opening) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        pause = 0.0
        while True:
            try:
                await self._follow()
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed, ActionError, ValueError) as exc:
                log.debug("the page keeper lost Chromium (%r); trying again", exc)
            except Exception:  # a bug must not end the watch for the session's life
                log.exception("the page keeper failed; trying again")
            self.kept.clear()
            pause = next_retry(pause, self._reached, min(FIRST_RETRY_S, self._retry_s), self._retry_s)
            self._reached = False
            await asyncio.sleep(pause)

    async def _follow(self) -> None:
        from websockets.asyncio.client import connect

        url = await cdp.upstream_url(self._cdp_url, None)
        async with connect(url, compression=None, max_size=MAX_EVENT_BYTES, ping_interval=None, open_timeout=10) as ws:
            self._reached = True
            self._count = PageCount()
            # Chromium reports the targets there are (targetCreated each) before it answers.
            await ws.send(json.dumps({"id": 1, "method": "Target.setDiscoverTargets", "params": _DISCOVER}))
            async for frame in ws:
                message = json.loads(frame)
                if not isinstance(message, dict):
                    continue
                if message.get("id") == 1:
                    self._settle(ws)
                    continue
                params = message.get("params")
                if isinstance(params, dict) and self._count.event(message.get("method"), params):
                    self._settle(ws)
                elif self._count.pages:
                    self.kept.set()

    def _settle(self, ws: ClientConnection) -> None:
        """After the last page went (or at start): a blank page opened, or Chromium closed for an export."""
        if self._count.pages:
            self.kept.set()
            return
        self.kept.clear()
        if self._opening is None or self._opening.done():
            self._opening = asyncio.create_task(self._reopen(ws, time.monotonic()))

    async def _reopen(self, ws: ClientConnection, since: float) -> None:
        if self._swapping():
            log.info("the last page closed during a state export: Chromium asked to close")
            with contextlib.suppress(Exception):
                await ws.send(json.dumps({"id": 2, "method": "Browser.close", "params": {}}))
            return
        try:
            await self._open_blank()
            self.opened += 1
            log.info("no page was open: a blank one opened in %.0f ms", (time.monotonic() - since) * 1000)
        except ActionError as exc:
            log.warning("no page opened after the last one closed: %s", exc)


__all__ = ["PageCount", "PageKeeper", "next_retry", "swap_under_way"]
