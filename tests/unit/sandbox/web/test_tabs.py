"""Which tab is on screen (FrontTab.pick) and the last page's guard, at their seams: each tab's answer
stands in for what Chromium's isolated world says (tests/integration/test_active_tab.py asks Chromium)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest

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


async def test_tabs_that_cannot_answer_leave_the_one_named_last_or_the_first() -> None:
    tabs = [Tab("a", None), Tab("b", None)]
    assert await pick(Asked(), tabs, tabs[1]) is tabs[1]
    assert await pick(Asked(), tabs, None) is tabs[0]
    gone = Tab("closed", FRONT)
    assert await pick(Asked(), tabs, gone) is tabs[0]  # a tab no longer open is never picked


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
