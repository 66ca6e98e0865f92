"""The page keeper's count of Chromium's pages, its check of the state export's lock, and what it does
when the last page went (a blank one opened; Chromium closed during an export)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from pathlib import Path

from corral.errors import ActionError, ErrorCode
from corral.sandbox.web.pagekeeper import FIRST_RETRY_S, RETRY_S, PageCount, PageKeeper, next_retry, swap_under_way


def _created(target: str, kind: str = "page") -> tuple[str, dict[str, object]]:
    return "Target.targetCreated", {"targetInfo": {"targetId": target, "type": kind, "url": "about:blank"}}


def test_the_count_says_when_the_last_page_closed() -> None:
    count = PageCount()
    assert not count.event(*_created("A"))
    assert not count.event(*_created("W", "service_worker"))  # not a page: not counted
    assert not count.event(*_created("B"))
    assert not count.event("Target.targetDestroyed", {"targetId": "A"})
    assert not count.event("Target.targetDestroyed", {"targetId": "W"})
    assert count.event("Target.targetDestroyed", {"targetId": "B"})  # the last page
    assert not count.event("Target.targetDestroyed", {"targetId": "B"})  # told twice: once only
    assert count.pages == set()


def test_the_count_ignores_what_it_cannot_read() -> None:
    count = PageCount()
    assert not count.event("Target.targetCreated", {"targetInfo": "page"})
    assert not count.event("Target.targetCreated", {"targetInfo": {"targetId": 7, "type": "page"}})
    assert not count.event("Target.attachedToTarget", {"targetInfo": {"targetId": "A", "type": "page"}})
    assert count.pages == set()


def test_a_swap_is_under_way_only_while_the_lock_is_held_exclusively(tmp_path: Path) -> None:
    lock = tmp_path / "browser.lock"
    assert not swap_under_way(str(lock))  # no lock file: no uid split, no export
    lock.touch()
    assert not swap_under_way(str(lock))
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert swap_under_way(str(lock))
        fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_SH)  # the init waiting to start Chromium holds it shared
        assert not swap_under_way(str(lock))
    finally:
        os.close(fd)


class _Socket:
    """The keeper's end of its CDP connection: what it sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    async def send(self, frame: str) -> None:
        self.sent.append(json.loads(frame))


def _keeper(swapping: bool, fails: bool = False) -> tuple[PageKeeper, list[str]]:
    opened: list[str] = []

    async def open_blank() -> None:
        if fails:
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, "no tab")
        opened.append("about:blank")

    return PageKeeper("http://127.0.0.1:9222", open_blank, swapping=lambda: swapping), opened


async def test_the_last_page_gone_a_blank_one_is_opened_once() -> None:
    keeper, opened = _keeper(swapping=False)
    ws = _Socket()
    keeper._settle(ws)  # type: ignore[arg-type]
    keeper._settle(ws)  # type: ignore[arg-type]  # told again while opening: one page, not two
    await asyncio.gather(*[t for t in [keeper._opening] if t is not None])
    assert opened == ["about:blank"] and keeper.opened == 1 and ws.sent == []
    assert not keeper.kept.is_set()  # set once Chromium reports the page


async def test_a_page_open_is_kept_and_nothing_opened() -> None:
    keeper, opened = _keeper(swapping=False)
    keeper._count.event(*_created("A"))
    keeper._settle(_Socket())  # type: ignore[arg-type]
    assert keeper.kept.is_set() and keeper._opening is None and opened == []


async def test_during_an_export_the_last_page_gone_chromium_is_closed_not_kept() -> None:
    keeper, opened = _keeper(swapping=True)
    ws = _Socket()
    keeper._settle(ws)  # type: ignore[arg-type]
    await asyncio.gather(*[t for t in [keeper._opening] if t is not None])
    assert opened == [] and [m["method"] for m in ws.sent] == ["Browser.close"]


async def test_a_blank_page_that_cannot_open_is_logged_not_raised() -> None:
    keeper, opened = _keeper(swapping=False, fails=True)
    keeper._settle(_Socket())  # type: ignore[arg-type]
    await asyncio.gather(*[t for t in [keeper._opening] if t is not None])
    assert opened == [] and keeper.opened == 0


def test_chromium_not_up_yet_is_tried_again_soon_then_less_often() -> None:
    pauses = [next_retry(0.0, reached=False)]
    while pauses[-1] < RETRY_S:
        pauses.append(next_retry(pauses[-1], reached=False))
    # At boot the controller may answer before Chromium's DevTools listen: the first retries come
    # within tens of ms (the health check waits for the page this watch opens), then back off.
    assert pauses[0] == FIRST_RETRY_S and pauses == sorted(pauses) and pauses[-1] == RETRY_S
    assert sum(pauses[:4]) < RETRY_S  # four tries in the time one took before
    assert next_retry(RETRY_S, reached=False) == RETRY_S
    assert next_retry(RETRY_S, reached=True) == FIRST_RETRY_S  # lost after it was reached: soon again
