"""Which of Chromium's tabs is the one on screen, and which one must stay open.

The tab on screen: each tab is asked whether it is shown (``document.visibilityState``) and has the
focus (``document.hasFocus()``) in an isolated world of the controller's own, where the page's scripts
cannot answer for it (they can redefine both in the page's own world). The answers are true only
because the controller's Playwright connects without its default overrides (``no_defaults``): its
focus emulation counts every tab it attaches to as captured, so visible, and focused.

The last page: Chromium (headful, on Linux) quits with its last page, so closing it is refused to a
CDP client and made safe for the controller's own ``tab_close`` (a blank tab opened first); both ask
one :class:`LastPage`, so a native close and a CDP close at once cannot both see two pages and close
them both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from playwright._impl._errors import Error as PlaywrightError

from corral.errors import ActionError
from corral.sandbox import devtools

if TYPE_CHECKING:
    from playwright.async_api import CDPSession, Page

log = logging.getLogger(__name__)

WORLD = "corral-front"  # the isolated world the controller asks in (a page cannot reach into it)
_ASK = "[document.visibilityState === 'visible', document.hasFocus()]"
# How long a tab may take to answer: a tab whose script never yields must not hold up every browser call.
ASK_TIMEOUT_S = 1.0


class Shown(NamedTuple):
    visible: bool
    focused: bool


class FrontTab:
    """Asks tabs whether they are on screen, over one CDP session per tab kept while the tab lives
    (its isolated world is made anew for each question: a navigation replaces it)."""

    def __init__(self) -> None:
        self._sessions: dict[Page, tuple[CDPSession, str]] = {}

    def forget(self, page: Page | None = None) -> None:
        """Drop one tab's session (it closed), or all of them (the connection went)."""
        if page is None:
            self._sessions.clear()
        else:
            self._sessions.pop(page, None)

    async def _session(self, page: Page) -> tuple[CDPSession, str]:
        known = self._sessions.get(page)
        if known is None:
            session = await page.context.new_cdp_session(page)
            info = await session.send("Target.getTargetInfo")
            # A page target's main frame has the target's id.
            known = self._sessions[page] = (session, str(info["targetInfo"]["targetId"]))
        return known

    async def shown(self, page: Page) -> Shown | None:
        """Whether ``page`` is shown and has the focus; None when it cannot say (closing, busy)."""
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                session, frame = await self._session(page)
                world = await session.send("Page.createIsolatedWorld", {"frameId": frame, "worldName": WORLD})
                answer = await session.send(
                    "Runtime.evaluate",
                    {"expression": _ASK, "contextId": world["executionContextId"], "returnByValue": True},
                )
        except (PlaywrightError, TimeoutError, KeyError, TypeError) as exc:
            log.debug("a tab could not say whether it is shown: %r", exc)
            self.forget(page)
            return None
        value = answer.get("result", {}).get("value")
        if not (isinstance(value, list) and len(value) == 2):
            return None
        return Shown(value[0] is True, value[1] is True)

    async def pick(self, pages: Sequence[Page], known: Page | None) -> Page:
        """The tab on screen among ``pages`` (in the order first seen): ``known`` (the one named active
        last) when it is still shown with the focus, else the newest shown tab with the focus, else
        ``known`` if still shown, else the newest shown one (another window's), else ``known`` or the
        first. One question when nothing changed."""
        for gone in self._sessions.keys() - set(pages):  # closed by a page, a person or a client
            del self._sessions[gone]
        known = known if known in pages else None
        first = await self.shown(known) if known is not None else None
        if known is not None and first == Shown(True, True):
            return known
        shown: Page | None = None
        for page in reversed(pages):
            if page is known:
                continue
            answer = await self.shown(page)
            if answer is None or not answer.visible:
                continue
            if answer.focused:
                return page
            shown = shown or page
        if known is not None and first is not None and first.visible:
            return known
        return shown or known or pages[0]


async def page_targets(cdp_url: str) -> Any:
    """Chromium's ``/json/list``, decoded."""
    return (await devtools.get(cdp_url, "/json/list", 5.0)).json()


class LastPage:
    """Judges each closing of a page, one at a time: closing the last open one is refused (a page
    already being closed no longer counts). Shared by the CDP relays and the controller's ``tab_close``."""

    def __init__(self, list_targets: Callable[[], Awaitable[Any]]) -> None:
        self._list_targets = list_targets
        self._lock = asyncio.Lock()
        self._closing: set[str] = set()

    async def refuses(self, target: str | None) -> bool:
        """Whether closing ``target`` (None: a page the caller cannot name, Page.close in a session)
        would close the last page; when not, ``target`` counts as closing from now on. Unknown
        (DevTools did not answer): refused."""
        async with self._lock:
            try:
                listed = await self._list_targets()
                pages = {t["id"] for t in listed if isinstance(t, dict) and t.get("type") == "page"}
            except (ActionError, ValueError, TypeError, KeyError):
                return True
            self._closing &= pages  # those gone are forgotten
            open_pages = pages - self._closing
            if target is not None and target not in open_pages:
                return False  # no page (a worker, an iframe) or one already closing: Chromium answers
            if len(open_pages) <= 1:
                return True
            if target is not None:
                self._closing.add(target)
            return False

    def closed(self, target: str) -> None:
        """``target`` is closed or did not close after all: it no longer counts as closing."""
        self._closing.discard(target)
