"""A native navigate on a tab that closed under it (a CDP client closed it a moment before Playwright
told the controller's connection) goes to the tab left on screen; any other failure stays the caller's."""

from __future__ import annotations

from typing import Any

import pytest
from playwright._impl._errors import Error as PlaywrightError
from playwright._impl._errors import TimeoutError as PlaywrightTimeout

from corral.errors import ActionError, ErrorCode
from corral.sandbox.web.downloadbook import DownloadBook
from corral.sandbox.web.navigation import TARGET_CLOSED, navigate_tab


class _Page:
    """The calls a navigation makes of a Playwright page; ``fails`` is what its goto raises."""

    def __init__(self, name: str, fails: str | None = None, closes: bool = False) -> None:
        self.url = "about:blank"
        self.name, self._fails, self._closes = name, fails, closes
        self.closed = False
        self.gone_to: list[str] = []

    async def goto(self, url: str, **_: Any) -> None:
        self.gone_to.append(url)
        if self._fails is not None:
            raise PlaywrightError(self._fails)
        self.url = url

    async def wait_for_load_state(self, *_: Any, **__: Any) -> None:
        if self.closed:
            raise PlaywrightError(TARGET_CLOSED)

    async def wait_for_event(self, event: str, **options: float) -> None:
        assert event == "close"
        if not self._closes:
            raise PlaywrightTimeout(f"Timeout {options['timeout']}ms exceeded while waiting for event 'close'")
        self.closed = True  # Playwright's close event, come after the call's failure

    def is_closed(self) -> bool:
        return self.closed

    async def evaluate(self, _script: str) -> None:
        return None

    async def title(self) -> str:
        return f"title of {self.name}"


def _picks(*pages: _Page) -> Any:
    left = list(pages)

    async def pick() -> _Page:
        return left.pop(0)

    return pick


async def test_a_tab_that_closed_under_the_navigation_hands_it_to_the_tab_on_screen() -> None:
    closing = _Page("closed by puppeteer", fails=f"Page.goto: {TARGET_CLOSED}", closes=True)
    on_screen = _Page("blank one opened for it")
    navigated = await navigate_tab(_picks(closing, on_screen), "https://allowed.test/", "load", 5_000, DownloadBook())
    assert (navigated["url"], navigated["title"]) == ("https://allowed.test/", "title of blank one opened for it")
    assert closing.gone_to == on_screen.gone_to == ["https://allowed.test/"]


async def test_a_tab_that_says_closed_but_stays_open_keeps_its_failure() -> None:
    """The context or the connection closed, not this page: nothing to hand the navigation to here."""
    page = _Page("open", fails=f"Page.goto: {TARGET_CLOSED}", closes=False)
    with pytest.raises(ActionError) as raised:
        await navigate_tab(_picks(page), "https://allowed.test/", "load", 5_000, DownloadBook())
    assert raised.value.code == ErrorCode.NAVIGATION_FAILED and TARGET_CLOSED in raised.value.message


async def test_any_other_failure_is_not_tried_again() -> None:
    page = _Page("refused", fails="net::ERR_TUNNEL_CONNECTION_FAILED at https://blocked.test/", closes=True)
    with pytest.raises(ActionError) as raised:
        await navigate_tab(_picks(page), "https://blocked.test/", "load", 5_000, DownloadBook())
    assert raised.value.code == ErrorCode.NAVIGATION_FAILED and "ERR_TUNNEL" in raised.value.message
    assert page.gone_to == ["https://blocked.test/"] and not page.closed  # no close waited for either
