"""The controller's book of downloads (corral.sandbox.web.downloadbook): Chromium's events read
bounded, each download's cause, the caps (a Cancel and the record marked), waits."""

from __future__ import annotations

import asyncio

import pytest

from corral.protocol.downloads import Download
from corral.sandbox.web.downloadbook import CDP_GRACE_S, NATIVE_GRACE_S, Acts, Cancel, DownloadBook

GUID = "c341624d-6c3a-4174-aff6-77bed4879276"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def book(max_file: int = 1000, max_session: int = 2500) -> tuple[DownloadBook, Clock]:
    clock = Clock()
    return DownloadBook(max_file, max_session, clock=clock, acts=Acts(clock)), clock


def test_a_download_s_life_from_chromium_s_events() -> None:
    downloads, clock = book()
    began = downloads.began(GUID, "https://x.test/r.pdf", "r.pdf")
    assert isinstance(began, Download) and (began.state, began.size, began.mime_type) == (
        "in_progress",
        0,
        "application/pdf",
    )
    assert began.cause.kind == "browser"
    assert downloads.progressed(GUID, 10, 20, "inProgress", None) is None
    clock.now += 2
    assert downloads.progressed(GUID, 20, 20, "completed", "/home/agent/Downloads/r (1).pdf") is None
    done = downloads.get(GUID)
    assert done is not None
    assert (done.state, done.size, done.total_bytes, done.name) == ("completed", 20, 20, "r (1).pdf")
    assert (done.path, done.finished_at) == ("/home/agent/Downloads/r (1).pdf", 1002.0)
    # Events after the end change nothing.
    assert downloads.progressed(GUID, 999, 999, "inProgress", None) is None
    assert downloads.get(GUID) == done
    assert downloads.listing().total_bytes == 20


@pytest.mark.parametrize(
    ("guid", "url", "name"),
    [(None, "u", "n"), ("../x", "u", "n"), ("x" * 65, "u", "n"), (7, "u", "n")],
)
def test_an_event_that_names_no_download_makes_none(guid: object, url: object, name: object) -> None:
    downloads, _ = book()
    assert downloads.began(guid, url, name) is None
    assert downloads.listing().downloads == []


def test_what_chromium_says_is_bounded() -> None:
    downloads, _ = book()
    began = downloads.began(GUID, "https://x.test/" + "a" * 5000, "../../" + "n" * 400 + ".exe")
    assert isinstance(began, Download)
    assert len(began.url) <= 2049 and began.url.endswith("…")
    assert len(began.name) <= 200 and began.name.endswith(".exe") and "/" not in began.name
    # A path outside the Downloads folder is never believed; a count that is no count is not taken.
    downloads.progressed(GUID, "lots", -5, "completed", "/etc/shadow")
    done = downloads.get(GUID)
    assert done is not None and done.path is None and done.size == 0 and done.total_bytes is None


def test_a_download_over_the_file_cap_is_cancelled_and_marked() -> None:
    downloads, _ = book(max_file=1000)
    downloads.began(GUID, "u", "big.bin")
    cancel = downloads.progressed(GUID, 10, 5000, "inProgress", None)  # the announced size is enough
    assert isinstance(cancel, Cancel) and cancel.id == GUID and "per download" in cancel.why
    capped = downloads.get(GUID)
    assert capped is not None and capped.state == "capped" and capped.error == cancel.why
    assert downloads.listing().total_bytes == 0  # Chromium deletes a cancelled download's file


def test_the_session_cap_stops_the_download_that_passes_it_and_any_after() -> None:
    downloads, _ = book(max_file=1000, max_session=2500)
    for n in range(2):
        downloads.began(f"g{n}", "u", f"{n}.bin")
        assert downloads.progressed(f"g{n}", 1000, 1000, "completed", None) is None
    downloads.began("g2", "u", "2.bin")
    cancel = downloads.progressed("g2", 600, 0, "inProgress", None)
    assert isinstance(cancel, Cancel) and "session" in cancel.why
    downloads.began("g3", "u", "3.bin")
    assert downloads.progressed("g3", 400, 0, "inProgress", None) is None
    assert downloads.progressed("g3", 500, 500, "completed", None) is None
    assert downloads.listing().total_bytes == 2500
    assert isinstance(downloads.began("g4", "u", "4.bin"), Cancel)  # at the cap: none more begins
    assert [r.state for r in downloads.listing().downloads] == [
        "completed",
        "completed",
        "capped",
        "completed",
        "capped",
    ]


def test_the_cause_is_the_running_action_then_the_latest_cdp_command_then_the_browser() -> None:
    clock = Clock()
    acts = Acts(clock)
    acts.native_started("a1.beef", "navigate")
    acts.cdp_command("cdp:c1", "c1.c1")
    assert acts.cause().model_dump(exclude_none=True) == {
        "kind": "action",
        "action_id": "a1.beef",
        "action": "navigate",
    }
    acts.native_ended("a1.beef")
    clock.now += 0.5
    acts.cdp_command("cdp:c2", None)  # a CDP command after the action ended: the CDP client's
    assert acts.cause().model_dump(exclude_none=True) == {"kind": "cdp", "actor": "cdp:c2"}
    clock.now += max(NATIVE_GRACE_S, CDP_GRACE_S) + 1
    assert acts.cause().kind == "browser"


def test_an_action_that_just_ended_still_caused_what_begins_now() -> None:
    clock = Clock()
    acts = Acts(clock)
    acts.native_started("a2.beef", "click")
    acts.native_ended("a2.beef")
    clock.now += NATIVE_GRACE_S - 0.1
    assert acts.cause().action_id == "a2.beef"
    acts.native_ended("a9.other")  # another's end changes nothing
    assert acts.cause().action_id == "a2.beef"


async def test_a_wait_returns_the_download_once_it_comes_and_none_after_its_time() -> None:
    downloads, _ = book()
    waiting = asyncio.create_task(downloads.wait_for(lambda d: d.state == "completed", 5))
    await asyncio.sleep(0)
    downloads.began(GUID, "u", "a.bin")
    await asyncio.sleep(0)
    assert not waiting.done()
    downloads.progressed(GUID, 1, 1, "completed", None)
    found = await waiting
    assert found is not None and found.id == GUID
    assert await downloads.wait_for(lambda d: d.id == "nope", 0) is None


def test_only_so_many_records_are_kept_the_oldest_finished_going_first() -> None:
    downloads, _ = book(max_file=10**9, max_session=10**12)
    for n in range(1003):
        downloads.began(f"g{n}", "u", "a.bin")
        if n:
            downloads.progressed(f"g{n}", 1, 1, "completed", None)
    kept = [r.id for r in downloads.listing().downloads]
    assert len(kept) == 1000 and kept[0] == "g0" and "g1" not in kept and kept[-1] == "g1002"


def test_a_record_that_goes_keeps_its_bytes_against_the_session_cap() -> None:
    # The attack: a page fills the cap with big downloads, then makes a thousand small ones so the big
    # ones' records go; their files are still on disk, so the cap must still count them.
    downloads, _ = book(max_file=1000, max_session=2500)
    for n in range(2):
        downloads.began(f"big{n}", "u", "a.bin")
        assert downloads.progressed(f"big{n}", 1000, 1000, "completed", None) is None
    for n in range(1000):
        downloads.began(f"small{n}", "u", "a.bin")
        downloads.progressed(f"small{n}", 0, 0, "completed", None)
    kept = {r.id for r in downloads.listing().downloads}
    assert "big0" not in kept and "big1" not in kept
    assert downloads.listing().total_bytes == 2000
    downloads.began("big2", "u", "a.bin")
    cancel = downloads.progressed("big2", 1000, 1000, "inProgress", None)
    assert isinstance(cancel, Cancel) and "session" in cancel.why
    assert downloads.listing().total_bytes == 2000
