"""LiveView's pacing and slots, over a scripted screen and a fake clock (no real waits)."""

from __future__ import annotations

import asyncio
from io import BytesIO

import pytest
from PIL import Image

from corral.sandbox.control.live import (
    FAST_POLL_S,
    IDLE_AFTER_S,
    IDLE_POLL_S,
    MAX_DEFER_S,
    MAX_FPS,
    LiveView,
    encode_jpeg,
    poll_interval,
)
from corral.sandbox.display.xcapture import Frame


class FakeClock:
    """Monotonic seconds that move only when a sleep is let go (:meth:`step`)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []
        self._pending: asyncio.Queue[tuple[float, asyncio.Future[None]]] = asyncio.Queue()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.put_nowait((seconds, done))
        await done

    async def step(self, extra: float = 0.0) -> float:
        """Lets the next sleep end (the clock moves by its length and ``extra``); its length. A sleep
        cancelled meanwhile (a wait that ended otherwise) is passed over."""
        seconds, done = await self._pending.get()
        while done.cancelled():
            seconds, done = await self._pending.get()
        self.slept.append(seconds)
        self.now += seconds + extra
        done.set_result(None)
        await asyncio.sleep(0)  # let the sleeper run on to its next wait
        return seconds


class ScriptedScreen:
    """A screen showing ``shown`` (the test changes it); counts grabs."""

    def __init__(self) -> None:
        self.shown = b"A"
        self.grabs = 0

    async def changed_frame(self, last: bytearray) -> Frame | None:
        self.grabs += 1
        if last == self.shown:
            return None
        last[:] = self.shown
        return Frame(1, 1, 4, self.shown)


async def fake_jpeg(frame: Frame) -> bytes:
    return b"jpeg:" + frame.data


def view() -> tuple[LiveView, ScriptedScreen, FakeClock]:
    screen, clock = ScriptedScreen(), FakeClock()
    return LiveView(screen, fake_jpeg, clock=clock, sleep=clock.sleep), screen, clock


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_nothing_is_grabbed_while_no_stream_is_open() -> None:
    live, screen, _ = view()
    await settle()
    assert screen.grabs == 0 and not live.polling
    stream = live.open()
    assert await stream.next() == b"jpeg:A"
    await stream.close()
    grabs = screen.grabs
    await settle()
    assert not live.polling and screen.grabs == grabs


async def test_an_unchanged_screen_is_not_encoded_again_and_a_change_is() -> None:
    live, screen, clock = view()
    stream = live.open()
    assert await stream.next() == b"jpeg:A"
    await clock.step()
    await clock.step()
    assert live.encodes == 1 and screen.grabs == 3
    screen.shown = b"B"
    await clock.step()
    assert await stream.next() == b"jpeg:B"
    assert live.encodes == 2
    await live.close()


async def test_polls_fast_after_a_change_and_back_off_after_a_second_idle() -> None:
    live, screen, clock = view()
    stream = live.open()
    await stream.next()
    assert await clock.step() == FAST_POLL_S
    await clock.step(extra=IDLE_AFTER_S)  # a second passes without a change
    assert await clock.step() == IDLE_POLL_S
    screen.shown = b"B"
    await clock.step()  # the grab after this sleep sees the change
    assert await clock.step() == FAST_POLL_S
    await live.close()


def test_the_poll_interval_follows_the_last_change() -> None:
    assert poll_interval(0) == FAST_POLL_S
    assert poll_interval(IDLE_AFTER_S - 0.01) == FAST_POLL_S
    assert poll_interval(IDLE_AFTER_S) == IDLE_POLL_S


async def test_a_slow_viewer_gets_only_the_newest_frame() -> None:
    live, screen, clock = view()
    stream = live.open()
    await settle()  # the first frame waits unsent
    for shown in (b"B", b"C", b"D"):
        screen.shown = shown
        await clock.step()
    assert stream.skipped == 3
    assert await stream.next() == b"jpeg:D"
    await live.close()


async def test_a_new_stream_gets_the_current_frame_at_once() -> None:
    live, screen, _ = view()
    first = live.open()
    assert await first.next() == b"jpeg:A"
    grabs = screen.grabs
    second = live.open()
    assert await second.next() == b"jpeg:A"
    assert screen.grabs == grabs and live.streams == 2
    await second.close()
    assert live.polling  # the first still watches
    await first.close()
    assert not live.polling


async def test_each_stream_sends_at_most_the_cap() -> None:
    live, screen, clock = view()
    stream = live.open()
    await stream.next()
    screen.shown = b"B"
    waiting = asyncio.create_task(stream.next())
    await settle()
    # The poller's sleep and the stream's cap wait are both pending: let the cap's go last.
    lengths = [await clock.step(), await clock.step()]
    assert pytest.approx(1 / MAX_FPS) in lengths
    assert await waiting == b"jpeg:B"
    await live.close()


async def test_closing_the_view_stops_polling_for_every_stream() -> None:
    live, _, _ = view()
    live.open()
    live.open()
    await settle()
    assert live.polling
    await live.close()
    assert not live.polling and live.streams == 0


def test_frames_are_jpeg_at_full_resolution() -> None:
    frame = Frame(4, 2, 16, bytes([0, 0, 255, 0]) * 8)
    jpeg = encode_jpeg(frame)
    assert jpeg[:3] == b"\xff\xd8\xff"
    image = Image.open(BytesIO(jpeg))
    assert image.size == (4, 2) and image.format == "JPEG"


class FlakyScreen(ScriptedScreen):
    """Fails its second grab (an X server restarting)."""

    async def changed_frame(self, last: bytearray) -> Frame | None:
        if self.grabs == 1:
            self.grabs += 1
            raise OSError("X connection lost")
        return await super().changed_frame(last)


async def test_a_failed_grab_does_not_end_the_stream() -> None:
    screen, clock = FlakyScreen(), FakeClock()
    live = LiveView(screen, fake_jpeg, clock=clock, sleep=clock.sleep)
    stream = live.open()
    assert await stream.next() == b"jpeg:A"
    await clock.step(extra=1.0)  # the failed grab (and time enough for the rate cap)
    screen.shown = b"B"
    await clock.step()
    assert await stream.next() == b"jpeg:B" and live.polling
    await live.close()


async def settle_all() -> None:
    """Enough turns of the loop for a wait's end to reach the view (the wait's tasks cancelled)."""
    for _ in range(50):
        await asyncio.sleep(0)


class Action:
    """An action holding the desktop (as Desktop.lock's ``locked`` and ``ended`` say)."""

    def __init__(self) -> None:
        self.running = True
        self._ended = asyncio.Event()

    def busy(self) -> bool:
        return self.running

    async def ended(self) -> None:
        await self._ended.wait()

    def end(self) -> None:
        self.running = False
        self._ended.set()
        self._ended = asyncio.Event()


def view_beside(action: Action) -> tuple[LiveView, ScriptedScreen, FakeClock]:
    screen, clock = ScriptedScreen(), FakeClock()
    live = LiveView(screen, fake_jpeg, clock=clock, sleep=clock.sleep, busy=action.busy, action_ended=action.ended)
    return live, screen, clock


async def test_an_action_running_on_the_desktop_comes_first() -> None:
    action = Action()
    live, screen, clock = view_beside(action)
    live.open()
    await settle_all()
    # No polling while it runs: one wait for its end, bounded by MAX_DEFER_S.
    assert screen.grabs == 0 and clock._pending.qsize() == 1
    action.end()
    await settle_all()
    assert screen.grabs == 0
    assert await clock.step() == FAST_POLL_S  # the action's reply goes first
    await settle_all()
    assert screen.grabs == 1  # then the view looks
    await live.close()


async def test_an_action_that_begins_right_after_the_last_comes_first_too() -> None:
    action = Action()
    live, screen, clock = view_beside(action)
    live.open()
    await settle_all()
    action.end()
    await settle_all()
    action.running = True  # the agent's next click, within FAST_POLL_S
    assert await clock.step() == FAST_POLL_S
    await settle_all()
    assert screen.grabs == 0
    action.end()
    await settle_all()
    assert await clock.step() == FAST_POLL_S
    await settle_all()
    assert screen.grabs == 1
    await live.close()


async def test_a_long_action_is_still_shown_as_it_goes() -> None:
    action = Action()  # never ends
    live, screen, clock = view_beside(action)
    stream = live.open()
    await settle_all()
    assert await clock.step() == MAX_DEFER_S and screen.grabs == 0
    await settle_all()
    assert screen.grabs == 1
    assert await stream.next() == b"jpeg:A"
    await live.close()
