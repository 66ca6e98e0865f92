"""Which of Chromium's tabs is the one on screen, and which one must stay open.

The tab on screen: each tab is asked whether it is shown (``document.visibilityState``) and has the
focus (``document.hasFocus()``) in an isolated world of the controller's own, where the page's scripts
cannot answer for it (they can redefine both in the page's own world). The answers are true only
because the controller's Playwright connects without its default overrides (``no_defaults``): its
focus emulation counts every tab it attaches to as captured, so visible, and focused.

The last page: closing it opens a blank tab first, for a CDP client's close
(docs/design/0381-closing-the-last-page.md) as for the controller's own ``tab_close``; both ask one
:class:`LastPage`, so a native close and a CDP close at once cannot both see two pages and close them
both. Chromium no longer quits with its last page (it runs on without a window: docs/design/0384,
corral.sandbox.web.pagekeeper), but the blank tab first leaves no moment without a page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from playwright._impl._errors import Error as PlaywrightError

from corral.errors import ActionError, ErrorCode
from corral.sandbox.web import devtools

if TYPE_CHECKING:
    from playwright.async_api import CDPSession, Page

log = logging.getLogger(__name__)

WORLD = "corral-front"  # the isolated world the controller asks in (a page cannot reach into it)
# The world's mark: a context id is kept from one question to the next (one round trip, not two), and
# after a navigation the same number may name another world of the new document, even the page's own.
# Only the controller's world holds this value (the page never sees it), so an answer without it is
# not taken: the world is made anew.
_MARK = secrets.token_hex(16)
_STATE = "[document.visibilityState === 'visible', document.hasFocus()]"
_ASK = f"globalThis.__corralFront === '{_MARK}' ? {_STATE} : null"
_MARK_AND_ASK = f"(globalThis.__corralFront = '{_MARK}', {_STATE})"
# How long a tab may take to answer: a tab whose script never yields must not hold up every browser call.
# A tab that did not answer in time is unknown, not hidden (docs/design/0411): on a loaded machine a
# healthy tab can take this long.
ASK_TIMEOUT_S = 1.0
# The most a choice of the active tab waits on questions: the tab named last, then all others at once.
PICK_BOUND_S = 2 * ASK_TIMEOUT_S


class Shown(NamedTuple):
    visible: bool
    focused: bool


@dataclass(slots=True)
class _Asking:
    """One tab's CDP session, its main frame, and its marked isolated world (None: to be made)."""

    session: CDPSession
    frame: str
    world: int | None = None


class FrontTab:
    """Asks tabs whether they are on screen, over one CDP session per tab kept while the tab lives."""

    def __init__(self) -> None:
        self._sessions: dict[Page, _Asking] = {}
        self._detaching: set[asyncio.Task[None]] = set()

    def forget(self, page: Page | None = None) -> None:
        """Drop all sessions (the connection went, and they with it), or one tab's (it closed, or its
        session failed), detached in the background: a session left attached would keep itself and
        an isolated world in the tab for the tab's life."""
        if page is None:
            self._sessions.clear()
            return
        asking = self._sessions.pop(page, None)
        if asking is not None:
            task = asyncio.create_task(_detach(asking.session))
            self._detaching.add(task)
            task.add_done_callback(self._detaching.discard)

    async def _asking(self, page: Page) -> _Asking:
        known = self._sessions.get(page)
        if known is None:
            session = await page.context.new_cdp_session(page)
            info = await session.send("Target.getTargetInfo")
            # A page target's main frame has the target's id.
            known = self._sessions[page] = _Asking(session, str(info["targetInfo"]["targetId"]))
        return known

    @staticmethod
    async def _evaluate(asking: _Asking, expression: str) -> Any:
        answer = await asking.session.send(
            "Runtime.evaluate", {"expression": expression, "contextId": asking.world, "returnByValue": True}
        )
        return answer.get("result", {}).get("value")

    async def _answer(self, page: Page) -> Any:
        asking = await self._asking(page)
        if asking.world is not None:
            with contextlib.suppress(PlaywrightError):  # the world went with its document
                value = await self._evaluate(asking, _ASK)
                if value is not None:
                    return value
        world = await asking.session.send("Page.createIsolatedWorld", {"frameId": asking.frame, "worldName": WORLD})
        asking.world = int(world["executionContextId"])
        return await self._evaluate(asking, _MARK_AND_ASK)

    async def shown(self, page: Page) -> Shown | None:
        """Whether ``page`` is shown and has the focus; None when it cannot say (closing, busy)."""
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                value = await self._answer(page)
        except TimeoutError:
            # Slow, not broken (a loaded machine, a busy page): its session and world stay for the next
            # question, which then costs one round trip, not the four of a new session.
            log.debug("a tab did not say within %.1f s whether it is shown", ASK_TIMEOUT_S)
            return None
        except (PlaywrightError, KeyError, TypeError, ValueError) as exc:
            log.debug("a tab could not say whether it is shown: %r", exc)
            self.forget(page)
            return None
        if not (isinstance(value, list) and len(value) == 2):
            return None
        return Shown(value[0] is True, value[1] is True)

    async def pick(self, pages: Sequence[Page], known: Page | None) -> Page:
        """The tab on screen among ``pages`` (in the order first seen): ``known`` (the one named active
        last) when it is still shown with the focus; else, the others asked at once, the newest shown
        tab with the focus, else ``known`` if still shown, else the newest shown one (another
        window's). A tab that did not answer is unknown, never taken for hidden: then ``known`` if it
        did not answer either, else the newest tab that did not answer, before any tab that said it is
        hidden (``known``, else the first). One question when nothing changed."""
        for gone in self._sessions.keys() - set(pages):  # closed by a page, a person or a client
            self.forget(gone)
        known = known if known in pages else None
        first = await self.shown(known) if known is not None else None
        if known is not None and first == Shown(True, True):
            return known
        others = [page for page in reversed(pages) if page is not known]
        answers = await asyncio.gather(*(self.shown(page) for page in others))
        return _chosen(known, first, list(zip(others, answers, strict=True))) or known or pages[0]


def _chosen(known: Page | None, first: Shown | None, answers: list[tuple[Page, Shown | None]]) -> Page | None:
    """The choice of :meth:`FrontTab.pick` from the answers (newest tab first); None: every tab
    answered and none is shown."""
    shown = [page for page, answer in answers if answer is not None and answer.visible]
    focused = [page for page, answer in answers if answer is not None and answer.visible and answer.focused]
    if focused:
        return focused[0]
    if known is not None and first is not None and first.visible:
        return known
    if shown:
        return shown[0]
    if known is not None and first is None:
        return known  # it did not answer, no other is shown: still the best guess
    return next((page for page, answer in answers if answer is None), None)


async def _detach(session: CDPSession) -> None:
    with contextlib.suppress(PlaywrightError, TimeoutError):  # the tab or the connection is gone: so is it
        async with asyncio.timeout(ASK_TIMEOUT_S):
            await session.detach()


async def page_targets(cdp_url: str) -> Any:
    """Chromium's ``/json/list``, decoded."""
    return (await devtools.get(cdp_url, "/json/list", 5.0)).json()


async def open_blank(cdp_url: str) -> None:
    """A new about:blank tab in Chromium's window (``PUT /json/new``); raises ActionError."""
    answer = await devtools.get(cdp_url, "/json/new?about:blank", 5.0, method="PUT")
    if answer.status != 200:
        raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Chromium's DevTools did not open a tab ({answer.status})")


class LastPage:
    """Judges each closing of a page, one at a time: the last open one closes only once a blank tab
    stands beside it (a page already being closed no longer counts). Shared by the CDP relays
    (:meth:`make_way`) and the controller's ``tab_close`` (:meth:`refuses`, then a page of its own)."""

    def __init__(
        self, list_targets: Callable[[], Awaitable[Any]], open_blank: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._list_targets = list_targets
        self._open_blank = open_blank
        self._lock = asyncio.Lock()
        self._closing: set[str] = set()

    async def refuses(self, target: str | None) -> bool:
        """Whether closing ``target`` (None: a page the caller cannot name, Page.close in a session)
        would close the last page; when not, ``target`` counts as closing from now on. Unknown
        (DevTools did not answer): refused."""
        async with self._lock:
            return not await self._let_through(target, None)

    async def make_way(self, target: str | None) -> bool:
        """Let ``target`` (None: a page the caller cannot name) close without Chromium: when it would
        leave no open page, a blank tab is opened first, so the close goes on and the browser stays.
        From then on ``target`` counts as closing. False when that cannot be done (DevTools did not
        answer or opened nothing): the caller refuses the close."""
        async with self._lock:
            return await self._let_through(target, self._open_blank)

    async def _let_through(self, target: str | None, open_blank: Callable[[], Awaitable[None]] | None) -> bool:
        """One judgement for both (under the lock): True when ``target`` may close (from then on it
        counts as closing), a blank tab opened first by ``open_blank`` when it is the last page; False
        when DevTools cannot say, or it is the last page and no blank tab was opened."""
        open_pages = await self._open_pages()
        if open_pages is None:
            return False
        if target is not None and target not in open_pages:
            return True  # no page (a worker, an iframe) or one already closing: Chromium answers
        if len(open_pages) <= 1:
            if open_blank is None:
                return False
            try:
                await open_blank()
            except ActionError as exc:
                log.warning("no blank tab opened before closing the last page: %s", exc)
                return False
        if target is not None:
            self._closing.add(target)
        return True

    async def pages_open(self) -> int:
        """How many pages Chromium lists that are not closing (0 when DevTools cannot say); after a
        :meth:`make_way` under way, its blank tab counted."""
        async with self._lock:
            return len(await self._open_pages() or ())

    async def _open_pages(self) -> set[str] | None:
        """The page targets not being closed (those gone forgotten); None when DevTools did not say."""
        try:
            listed = await self._list_targets()
            pages = {t["id"] for t in listed if isinstance(t, dict) and t.get("type") == "page"}
        except (ActionError, ValueError, TypeError, KeyError):
            return None
        self._closing &= pages
        return pages - self._closing

    def closed(self, target: str) -> None:
        """``target`` is closed or did not close after all: it no longer counts as closing."""
        self._closing.discard(target)
