"""The page requests in flight, as Playwright reports them: whether a page is still loading, which
the settle after an action waits for."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.async_api import BrowserContext, Request

# A request pending longer than this is a long poll or a stream, not page loading.
LOADING_REQUEST_S = 1.5


class InFlight:
    """The requests of every tracked context, by when each started."""

    def __init__(self) -> None:
        self._pending: dict[Request, float] = {}

    def track(self, context: BrowserContext) -> None:
        context.on("request", self._started)
        context.on("requestfinished", self._ended)
        context.on("requestfailed", self._ended)

    def _started(self, request: Request) -> None:
        self._pending[request] = time.monotonic()

    def _ended(self, request: Request) -> None:
        self._pending.pop(request, None)

    def clear(self) -> None:
        """The connection went: its requests will never say they ended."""
        self._pending.clear()

    def loading(self) -> bool:
        """Whether a page has a request in flight (long polls and streams aside)."""
        if not self._pending:
            return False
        cutoff = time.monotonic() - LOADING_REQUEST_S
        return any(started > cutoff for started in self._pending.values())
