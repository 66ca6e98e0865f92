"""The Playwright connection to the sandbox's Chromium, made lazily, remade after a restart, and its
driver stopped when idle.

The Playwright driver (a node process, about 80 MiB PSS) is started on first need and stopped
after ``idle_stop_s`` without a browser call: an idle session does not hold it. Chromium and its
tabs are not the driver's, so they stay as they are across a stop; the next browser call starts
the driver again (about 0.3 s) and finds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import re
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING

# Playwright's errors alone at import: its API (about 90 ms of every cold start's controller, on CPUs
# Chromium is starting on) is imported with the driver, on the first browser call (:meth:`Driver.connect`).
from playwright._impl._errors import Error as PlaywrightError

from corral.errors import ActionError, ErrorCode
from corral.sandbox.web import devtools

if TYPE_CHECKING:
    from playwright.async_api import Browser as PWBrowser
    from playwright.async_api import Playwright

log = logging.getLogger("corral.sandbox.web.browser")  # the name the logs have always had

_BROWSER_PATH = re.compile(r"/devtools/browser/[A-Za-z0-9-]{1,64}")


def pinned_endpoint(cdp_url: str, named: object) -> str | None:
    """The browser WebSocket that ``/json/version`` named, if it is on the DevTools address itself.

    Chromium runs as the agent's uid, so a command can kill it and answer on its port before it
    comes back: what that answer names must never send the controller's Playwright (uid corral)
    anywhere else, such as the controller's own port or the proxy's control port.
    """
    if not isinstance(named, str):
        return None
    expected, given = urllib.parse.urlsplit(cdp_url), urllib.parse.urlsplit(named)
    if given.scheme != "ws" or given.hostname != expected.hostname or given.port != expected.port:
        return None
    if given.query or given.fragment or given.username or not _BROWSER_PATH.fullmatch(given.path):
        return None
    return f"ws://{expected.hostname}:{expected.port}{given.path}"


class Driver:
    """The driver and its one connection. ``on_connected`` sees each new connection before it is
    used (the tabs and the request tracking start over on it); ``on_lost`` is called when it went
    (Chromium restarted, or the idle stop), so nothing of the old one is kept."""

    def __init__(
        self,
        cdp_url: str,
        *,
        connect_timeout_s: float,
        idle_stop_s: float,
        busy: Callable[[], bool],
        stopped: Callable[[], None],
        on_connected: Callable[[PWBrowser], None],
        on_lost: Callable[[], None],
    ) -> None:
        self.cdp_url = cdp_url
        self._connect_timeout_s = connect_timeout_s
        self._idle_stop_s = idle_stop_s
        self._busy = busy
        self._stopped = stopped  # called after an idle stop (the controller gives freed memory back)
        self._on_connected = on_connected
        self._on_lost = on_lost
        self._playwright: Playwright | None = None
        self._browser: PWBrowser | None = None
        self._lock = asyncio.Lock()
        self._last_use = time.monotonic()
        self._stopping = False  # the idle stop drops the connection on purpose: no warning for it
        self._reaper: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        self.stops = 0  # idle stops so far (for tests and logs)

    async def devtools_answer(self) -> bool:
        """Whether Chromium's DevTools endpoint answers (readiness; the Playwright link may still be forming)."""
        try:
            answer = await devtools.get(self.cdp_url, "/json/version", 1.0)
        except ActionError:
            return False
        return answer.status == 200

    async def _browser_endpoint(self) -> str:
        """The browser's DevTools WebSocket, pinned to the DevTools address (see :func:`pinned_endpoint`)."""
        try:
            answer = await devtools.get(self.cdp_url, "/json/version", self._connect_timeout_s)
            named = answer.json().get("webSocketDebuggerUrl")
        except (ActionError, ValueError, AttributeError) as exc:
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Chromium's DevTools did not answer: {exc!r}") from None
        endpoint = pinned_endpoint(self.cdp_url, named)
        if endpoint is None:
            log.warning("DevTools named a browser endpoint off its own address: %r", named)
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, "Chromium's DevTools named an unexpected endpoint")
        return endpoint

    @property
    def connected(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    @property
    def running(self) -> bool:
        return self._playwright is not None

    def wanted(self) -> None:
        """Start the driver in the background if it is stopped; nothing waits for it, and a failure
        shows at the next browser call."""
        self._last_use = time.monotonic()
        if self.connected or (self._starting is not None and not self._starting.done()):
            return
        self._starting = asyncio.create_task(self._start_quietly())

    async def _start_quietly(self) -> None:
        with contextlib.suppress(ActionError):
            await self.connect()

    async def connect(self) -> PWBrowser:
        self._last_use = time.monotonic()
        async with self._lock:
            self._last_use = time.monotonic()
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            browser = await self._connect_over_cdp()
            browser.on("disconnected", self._forget)
            await _downloads_as_the_policy_says(browser)
            self._on_connected(browser)
            self._browser = browser
            self._last_use = time.monotonic()
            if self._idle_stop_s > 0 and (self._reaper is None or self._reaper.done()):
                self._reaper = asyncio.create_task(self._stop_when_idle())
            return browser

    async def _connect_over_cdp(self) -> PWBrowser:
        try:
            if self._playwright is None:
                self._playwright = await _start_playwright()
            # Without Playwright's default overrides: its focus emulation makes every tab it attaches
            # to visible and focused, so no tab could say whether it is the one on screen (tabs.py).
            return await self._playwright.chromium.connect_over_cdp(
                await self._browser_endpoint(), timeout=self._connect_timeout_s * 1000, no_defaults=True
            )
        except PlaywrightError as exc:
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Chromium is not reachable: {exc.message}") from None
        except Exception as exc:  # the Playwright driver failed to start, or DevTools did not answer
            log.exception("the Playwright driver failed")
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Playwright driver failed: {exc}") from None

    async def _stop_when_idle(self) -> None:
        """Stop the driver once no browser call has come for ``idle_stop_s`` (and no action runs)."""
        while self._playwright is not None:
            idle = time.monotonic() - self._last_use
            if idle < self._idle_stop_s or self._busy() or self._lock.locked():
                await asyncio.sleep(max(0.5, self._idle_stop_s - idle))
                continue
            async with self._lock:
                if time.monotonic() - self._last_use < self._idle_stop_s or self._busy():
                    continue
                await self._stop_driver()
                self.stops += 1
                self._stopped()
                log.info("stopped the Playwright driver after %.0f s unused; Chromium keeps its tabs", idle)
            return

    async def _stop_driver(self) -> None:
        """End the driver (node) and with it the connection; Chromium and its pages are left as they are.
        Not ``Browser.close()``: over CDP that closes the contexts Playwright made."""
        self._stopping = True
        try:
            if self._playwright is not None:
                await self._playwright.stop()
        except Exception as exc:  # it is going either way
            log.warning("the Playwright driver did not stop cleanly: %r", exc)
        finally:
            self._playwright = None
            self._browser = None
            self._on_lost()
            self._stopping = False

    def _forget(self, _browser: PWBrowser) -> None:
        if not self._stopping:
            log.warning("lost the connection to Chromium; reconnecting on the next browser action")
        self._browser = None
        self._on_lost()

    async def close(self) -> None:
        for task in (self._reaper, self._starting):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._reaper, self._starting) if t is not None), return_exceptions=True)
        if self._browser is not None:
            await self._browser.close()
            self._browser = None
        if self._playwright is not None:
            await self._playwright.stop()
            self._playwright = None


async def _start_playwright() -> Playwright:
    """Playwright's driver, started; its API imported first on a thread, so the event loop serves meanwhile."""
    api = await asyncio.to_thread(importlib.import_module, "playwright.async_api")
    started: Playwright = await api.async_playwright().start()
    return started


async def _downloads_as_the_policy_says(browser: PWBrowser) -> None:
    """Give downloads back to Chromium's own handling, where the managed policy saves them in the
    agent's Downloads folder under their own names: connecting over CDP, Playwright points the
    default context's downloads at a temporary folder of the controller's (which Chromium, running
    as the agent, cannot write) and names them by GUID."""
    try:
        session = await browser.new_browser_cdp_session()
        try:
            await session.send("Browser.setDownloadBehavior", {"behavior": "default"})
        finally:
            await session.detach()
    except PlaywrightError as exc:
        log.warning("downloads stay as Playwright set them: %s", exc.message)
