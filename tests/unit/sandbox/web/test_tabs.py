"""Which tab is on screen (FrontTab.pick) and the last page's guard, at their seams: each tab's answer
stands in for what Chromium's isolated world says (tests/integration/test_active_tab.py asks Chromium)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
from playwright._impl._errors import Error as PlaywrightError

from corral.sandbox.web import tabs as tabs_module
from corral.sandbox.web.tabs import FrontTab, LastPage, Shown


class Tab:
    """A page as FrontTab sees it: the test says whether it is shown."""

    def __init__(self, name: str, shown: Shown | None) -> None:
        self.name, self.answer = name, shown

    def __repr__(self) -> str:
        return self.name


class Asked(FrontTab):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def shown(self, page: Any) -> Shown | None:
        self.asked.append(page.name)
        answer: Shown | None = page.answer
        return answer


async def pick(front: FrontTab, tabs: Sequence[Tab], known: Tab | None) -> Any:
    return await front.pick(cast(Any, tabs), cast(Any, known))


FRONT, BEHIND, OTHER_WINDOW = Shown(True, True), Shown(False, False), Shown(True, False)


async def test_the_known_tab_still_in_front_costs_one_question() -> None:
    front = Asked()
    opener, popup = Tab("opener", FRONT), Tab("popup", BEHIND)
    assert await pick(front, [opener, popup], opener) is opener
    assert front.asked == ["opener"]


async def test_a_popup_in_front_is_picked_over_the_opener_named_last() -> None:
    front = Asked()
    opener, popup = Tab("opener", BEHIND), Tab("popup", FRONT)
    assert await pick(front, [opener, popup], opener) is popup


async def test_after_a_new_connection_the_tab_on_screen_is_found() -> None:
    tabs = [Tab("a", BEHIND), Tab("b", FRONT), Tab("c", BEHIND)]
    assert await pick(Asked(), tabs, None) is tabs[1]


async def test_the_focused_window_wins_over_another_shown_window() -> None:
    window, popup_window = Tab("window", OTHER_WINDOW), Tab("popup window", FRONT)
    assert await pick(Asked(), [window, popup_window], window) is popup_window
    # No window has the focus (a terminal has it): the one named last stays while it is shown.
    popup_window.answer = OTHER_WINDOW
    assert await pick(Asked(), [window, popup_window], window) is window


async def test_tabs_that_cannot_answer_leave_the_one_named_last_or_the_newest() -> None:
    tabs = [Tab("a", None), Tab("b", None)]
    assert await pick(Asked(), tabs, tabs[0]) is tabs[0]
    assert await pick(Asked(), tabs, None) is tabs[1]
    gone = Tab("closed", FRONT)
    assert await pick(Asked(), tabs, gone) is tabs[1]  # a tab no longer open is never picked


async def test_a_tab_too_slow_to_answer_is_not_taken_for_hidden() -> None:
    # A loaded machine: the popup on screen does not answer within ASK_TIMEOUT_S. The opener said it
    # is hidden, so it is not the one a navigate or a keystroke may go to (docs/design/0411).
    opener, popup = Tab("opener", BEHIND), Tab("popup", None)
    assert await pick(Asked(), [opener, popup], opener) is popup
    assert await pick(Asked(), [opener, popup], None) is popup  # after a new connection
    # The tab named last did not answer either and no other is shown: it stays.
    assert await pick(Asked(), [opener, popup], popup) is popup
    # Every tab said it is hidden (no window shown): the one named last, else the first.
    popup.answer = BEHIND
    assert await pick(Asked(), [opener, popup], popup) is popup
    assert await pick(Asked(), [opener, popup], None) is opener


class AskedAtOnce(Asked):
    """Counts the questions in flight at once (each yields to the loop before it answers)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = self.most_in_flight = 0

    async def shown(self, page: Any) -> Shown | None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        for _ in range(3):
            await asyncio.sleep(0)
        self.in_flight -= 1
        return await super().shown(page)


async def test_the_other_tabs_are_asked_at_once_so_a_choice_waits_two_timeouts_at_most() -> None:
    front = AskedAtOnce()
    tabs = [Tab("a", BEHIND), Tab("b", BEHIND), Tab("c", FRONT), Tab("d", None)]
    assert await pick(front, tabs, tabs[0]) is tabs[2]
    assert front.asked[0] == "a" and sorted(front.asked[1:]) == ["b", "c", "d"]
    assert front.most_in_flight == 3


class Targets:
    def __init__(self, *ids: str) -> None:
        self.ids = list(ids)

    async def __call__(self) -> list[dict[str, str]]:
        return [{"id": i, "type": "page"} for i in self.ids]


async def test_a_close_already_under_way_counts_so_the_second_is_refused() -> None:
    last = LastPage(Targets("P1", "P2"))
    assert not await last.refuses("P1")  # the native close, judged first
    assert await last.refuses("P2")  # a CDP close at the same moment: P1 is going, P2 would be the last
    last.closed("P1")  # the native close failed after all: P1 counts again
    assert not await last.refuses("P2")


@pytest.mark.parametrize("target", ["P1", None])
async def test_the_only_page_is_never_closed(target: str | None) -> None:
    assert await LastPage(Targets("P1")).refuses(target)


class Session:
    """A tab's CDP session as Chromium answers: isolated worlds by id, each with the mark set in it."""

    def __init__(self, visible: bool) -> None:
        self.visible = visible
        self.sent: list[str] = []
        self.marks: dict[int, str | None] = {}

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.sent.append(method)
        if method == "Target.getTargetInfo":
            return {"targetInfo": {"targetId": "T1"}}
        if method == "Page.createIsolatedWorld":
            made = len(self.marks) + 1
            self.marks[made] = None
            return {"executionContextId": made}
        assert method == "Runtime.evaluate" and params is not None
        world, expression = params["contextId"], str(params["expression"])
        mark = expression.split("'")[1]
        if expression.startswith("(globalThis.__corralFront = "):
            self.marks[world] = mark
        elif self.marks[world] != mark:
            return {"result": {"type": "object", "subtype": "null", "value": None}}
        return {"result": {"value": [self.visible, self.visible]}}


async def test_a_tab_is_asked_in_one_round_trip_and_a_world_without_the_mark_is_not_believed() -> None:
    session = Session(visible=True)
    page = Tab("tab", None)
    page.context = SimpleNamespace(new_cdp_session=lambda _page: _coro(session))  # type: ignore[attr-defined]
    front = FrontTab()
    assert await front.shown(cast(Any, page)) == Shown(True, True)
    assert session.sent == ["Target.getTargetInfo", "Page.createIsolatedWorld", "Runtime.evaluate"]
    session.sent.clear()
    assert await front.shown(cast(Any, page)) == Shown(True, True)
    assert session.sent == ["Runtime.evaluate"]  # the world is kept
    # A navigation: the kept id now names a world of the new document without the mark (as the page's
    # own world would be, whatever it claims): not believed, and a world is made anew.
    session.marks = dict.fromkeys(session.marks)
    session.visible = False
    session.sent.clear()
    assert await front.shown(cast(Any, page)) == Shown(False, False)
    assert session.sent == ["Runtime.evaluate", "Page.createIsolatedWorld", "Runtime.evaluate"]


async def _coro(value: Any) -> Any:
    return value


class SlowSession(Session):
    """A tab's session whose next ``Runtime.evaluate`` does not answer (a loaded machine), or fails."""

    def __init__(self) -> None:
        super().__init__(visible=True)
        self.stall, self.fail, self.detached = False, False, 0

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        if method == "Runtime.evaluate" and self.stall:
            self.stall = False
            await asyncio.Event().wait()
        if self.fail:  # the tab closed under it
            raise PlaywrightError("Target page, context or browser has been closed")
        return await super().send(method, params)

    async def detach(self) -> None:
        self.detached += 1


async def test_a_question_that_timed_out_keeps_its_session_and_a_failed_one_is_detached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sessions: list[SlowSession] = []

    async def new_session(_page: Any) -> SlowSession:
        sessions.append(SlowSession())
        return sessions[-1]

    page = Tab("tab", None)
    page.context = SimpleNamespace(new_cdp_session=new_session)  # type: ignore[attr-defined]
    front = FrontTab()
    assert await front.shown(cast(Any, page)) == Shown(True, True)
    sessions[0].stall = True
    monkeypatch.setattr(tabs_module, "ASK_TIMEOUT_S", 0)  # the timeout fires at the stalled answer
    assert await front.shown(cast(Any, page)) is None  # not answered in time: unknown
    monkeypatch.setattr(tabs_module, "ASK_TIMEOUT_S", 1.0)  # answered at once: never reached
    sessions[0].sent.clear()
    assert await front.shown(cast(Any, page)) == Shown(True, True)
    assert len(sessions) == 1 and sessions[0].sent == ["Runtime.evaluate"]  # the same session and world
    # A session that fails is dropped and detached (not left attached with its world), and made anew.
    sessions[0].fail = True
    assert await front.shown(cast(Any, page)) is None
    await asyncio.sleep(0)  # the detach runs in the background
    assert sessions[0].detached == 1
    assert await front.shown(cast(Any, page)) == Shown(True, True)
    assert len(sessions) == 2
