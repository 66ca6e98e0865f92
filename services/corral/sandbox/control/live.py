"""The screen as live streams see it: JPEG frames, sent when the screen changes, only while someone watches.

:class:`LiveView` (one per controller) grabs nothing and encodes nothing while no stream is open.
With one or more it polls the screen through its capture thread (MIT-SHM, about a millisecond a
grab), compares each grab with the last frame encoded (bytes equality, memcmp off the GIL) and, when it changed,
encodes a JPEG (quality 70, full resolution) on a thread of its own (never the capture or the
screenshot thread: an agent's screenshot must not wait behind a viewer's frame) and offers it to
every stream. Each :class:`LiveStream` holds only the newest frame it has not sent: a slow viewer
skips frames, it never queues them.

An action running on the desktop comes first: while it holds the desktop's lock the view does not
look; it waits for the action's end (told by the lock, corral.sandbox.control.turns, not polled), then one
:data:`FAST_POLL_S` more (the action's reply leaves, the next action of a quick agent starts) before
it grabs, so a viewer costs the agent's actions next to nothing. An action longer than
:data:`MAX_DEFER_S` (the default settle timeout) is still shown as it goes.

Pacing: a poll every :data:`FAST_POLL_S` after a change, backing off to :data:`IDLE_POLL_S` after
:data:`IDLE_AFTER_S` without one; each stream sends at most :data:`MAX_FPS` frames a second. A
new stream gets the current frame at once.

XDamage would tell an idle screen from a changed one without a grab; polling an idle screen costs a
grab and a compare (about 2 ms) ten times a second, so the simpler path is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from corral.sandbox.display import encode as enc
from corral.sandbox.display.xcapture import Frame

log = logging.getLogger(__name__)

FAST_POLL_S = 0.033
IDLE_POLL_S = 0.100
IDLE_AFTER_S = 1.0
MAX_FPS = 15
JPEG_QUALITY = 70
ENCODER_NICE = 10
MAX_DEFER_S = 3.0  # corral.protocol.envelope.Limits.settle_timeout_ms: an action settling is not shown

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class Grabber(Protocol):
    """What the view grabs from (corral.sandbox.display.screen.Screen)."""

    async def changed_frame(self, last: bytearray) -> Frame | None:
        """The screen when it differs from ``last`` (which then holds it; empty: no frame yet), else None."""
        ...


Encoder = Callable[[Frame], Awaitable[bytes]]


def encode_jpeg(frame: Frame) -> bytes:
    """One frame as a JPEG file's bytes, full resolution."""
    return enc.encode(enc.frame_to_image(frame), "jpeg", quality=JPEG_QUALITY).data


def _lower_priority() -> None:
    # A viewer's frame may wait; the agent's next screenshot, encoded meanwhile, should not (Linux
    # sets a nice value per thread).
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), ENCODER_NICE)


class ThreadEncoder:
    """JPEG encoding on a thread of its own, at a lower priority (Pillow releases the GIL while it
    compresses into corral.sandbox.display.encode's memory file; into a BytesIO it would not)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-live", initializer=_lower_priority)

    async def __call__(self, frame: Frame) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(self._pool, encode_jpeg, frame)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def poll_interval(since_change_s: float) -> float:
    """How long to wait before the next grab, given how long the screen has not changed."""
    return FAST_POLL_S if since_change_s < IDLE_AFTER_S else IDLE_POLL_S


class LiveStream:
    """One viewer's side of the view: the newest frame not yet sent, paced to :data:`MAX_FPS`."""

    def __init__(self, view: LiveView) -> None:
        self._view = view
        self._slot: bytes | None = None
        self._ready = asyncio.Event()
        self._sent_at: float | None = None
        self.skipped = 0  # frames replaced before they were sent (this viewer was slow)

    def offer(self, frame: bytes) -> None:
        if self._slot is not None:
            self.skipped += 1
        self._slot = frame
        self._ready.set()

    async def next(self) -> bytes:
        """The newest frame, once there is one and the rate cap allows it."""
        if self._sent_at is not None:
            wait = self._sent_at + 1 / MAX_FPS - self._view.clock()
            if wait > 0:
                await self._view.sleep(wait)
        await self._ready.wait()
        frame, self._slot = self._slot, None
        self._ready.clear()
        assert frame is not None
        self._sent_at = self._view.clock()
        return frame

    async def close(self) -> None:
        await self._view.remove(self)


class LiveView:
    """See the module's docstring. ``clock``/``sleep``: monotonic seconds and a wait (fakes in tests)."""

    def __init__(
        self,
        grabber: Grabber,
        encoder: Encoder,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        busy: Callable[[], bool] = lambda: False,
        action_ended: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._grabber = grabber
        self._encoder = encoder
        self._busy = busy  # an action runs on the desktop (Desktop.lock is held)
        # Returns when the running action ends (ActionLock.ended); without it, the view looks again
        # each FAST_POLL_S.
        self._action_ended = action_ended
        self.clock = clock
        self.sleep = sleep
        self._streams: list[LiveStream] = []
        self._poller: asyncio.Task[None] | None = None
        self._last = bytearray()  # the raw frame the current JPEG was made from (empty: none yet)
        self._current: bytes | None = None  # the newest JPEG
        self.grabs = 0
        self.encodes = 0

    @property
    def streams(self) -> int:
        return len(self._streams)

    @property
    def polling(self) -> bool:
        return self._poller is not None and not self._poller.done()

    def open(self) -> LiveStream:
        """A new stream; it gets the current frame at once (the first grab's, if polling just began)."""
        stream = LiveStream(self)
        self._streams.append(stream)
        if self._current is not None:
            stream.offer(self._current)
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll(), name="corral-live-poll")
        return stream

    async def remove(self, stream: LiveStream) -> None:
        """Closes ``stream``; the last one closing stops the polling (awaited: no grab after this)."""
        if stream in self._streams:
            self._streams.remove(stream)
        if not self._streams:
            await self._stop()

    async def close(self) -> None:
        self._streams.clear()
        await self._stop()

    async def _stop(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        # A stale frame must not greet the next viewer: the next poll starts from a fresh grab.
        self._last, self._current = bytearray(), None

    async def _poll(self) -> None:
        changed_at = self.clock()
        while True:
            await self._between_actions()
            try:
                if await self._look():
                    changed_at = self.clock()
            except Exception:  # the X server restarting, say: viewers keep the last frame meanwhile
                log.warning("live view: no frame this time", exc_info=True)
            await self.sleep(poll_interval(self.clock() - changed_at))

    async def _between_actions(self) -> None:
        """Waits while the desktop runs actions, up to :data:`MAX_DEFER_S` in all: the action comes
        first (its grabs, its encode, its CPU), the viewer sees its outcome one :data:`FAST_POLL_S`
        after it ends (its reply has left, an agent's next action may have begun: then that one
        first too); one longer than that (a drag, a slow page) is still shown as it goes."""
        deadline = self.clock() + MAX_DEFER_S
        while self._busy():
            left = deadline - self.clock()
            if left <= 0:
                return
            await self._until_action_ends(left)
            if not self._busy():
                await self.sleep(min(FAST_POLL_S, max(deadline - self.clock(), 0)))

    async def _until_action_ends(self, at_most_s: float) -> None:
        if self._action_ended is None:
            await self.sleep(min(FAST_POLL_S, at_most_s))
            return
        ended = asyncio.ensure_future(self._action_ended())
        timer = asyncio.ensure_future(self.sleep(at_most_s))
        try:
            await asyncio.wait((ended, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (ended, timer):
                waiting.cancel()
            await asyncio.gather(ended, timer, return_exceptions=True)

    async def _look(self) -> bool:
        """One grab; when the screen changed, a frame offered to every stream. Whether it changed."""
        frame = await self._grabber.changed_frame(self._last)
        self.grabs += 1
        if frame is None:
            return False
        jpeg = await self._encoder(frame)
        self.encodes += 1
        self._current = jpeg
        for stream in self._streams:
            stream.offer(jpeg)
        return True
