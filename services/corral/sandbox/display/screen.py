"""The screen as the controller sees it: grabs and encodes on one capture thread, and settle detection.

``wait_stable`` replaces the fixed sleeps other tools put after an action: it
polls MIT-SHM frames (about 1 ms each) and returns once nothing has changed
for ``quiet_ms`` and the page has no request in flight, or at ``timeout_ms``
with ``settled=False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from corral.protocol.actions import ImageFormat, Region
from corral.protocol.plan import EncodedImage
from corral.sandbox.display import encode as enc
from corral.sandbox.display.xcapture import CursorImage, Frame, ShmCapture

T = TypeVar("T")
log = logging.getLogger(__name__)


def _log_failure(done: Future[None]) -> None:
    if (exc := done.exception()) is not None:
        log.warning("the screen's shared segment was not handed back: %s", exc)


@dataclass(frozen=True, slots=True)
class Settled:
    frame: Frame
    settle_ms: float
    settled: bool


class Screen:
    """Owns the capture connection; every X call on it runs on a single dedicated thread."""

    def __init__(self, display: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-capture")
        self._capture = self._pool.submit(ShmCapture, display).result()
        self.width = self._capture.width
        self.height = self._capture.height

    async def _on_thread(self, fn: object, *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)  # type: ignore[arg-type]

    async def grab(self) -> Frame:
        frame: Frame = await self._on_thread(self._capture.grab)
        return frame

    def release_soon(self) -> None:
        """The shared segment's pages handed back, on the capture thread (after any grab queued there),
        for an idle session: the next grab faults them in again."""
        with contextlib.suppress(RuntimeError):  # closed meanwhile: the segment went with it
            self._pool.submit(self._capture.release).add_done_callback(_log_failure)

    async def changed_frame(self, last: bytearray) -> Frame | None:
        """The screen when it differs from ``last`` (which then holds it), else None; compared and
        copied off the GIL on the capture thread (corral.sandbox.control.live polls with it). The frame's data
        is ``last`` itself, not a copy (4 MB copied on the event loop cost the agent's actions): it is
        valid until the next call with ``last``."""
        changed: bool = await self._on_thread(self._capture.grab_if_changed, last)
        return Frame(self.width, self.height, self._capture.stride, last) if changed else None

    async def wait_stable(
        self,
        quiet_ms: int,
        timeout_ms: int,
        poll_ms: int,
        *,
        min_ms: int = 0,
        busy: Callable[[], bool] = lambda: False,
    ) -> Settled:
        """The screen once it has not changed for ``quiet_ms`` and ``min_ms`` passed since the last activity.

        Activity is the action itself and any request the page had in flight (``busy``): pages react
        to a click or a response a little later (a timer, a render), and that reaction is what the
        agent must see, so a quiet screen alone is not enough right after it.
        """
        start = time.monotonic()
        last = await self.grab()
        last_change = start
        activity = start
        while True:
            now = time.monotonic()
            if busy():
                activity = now
            if (now - last_change) * 1000 >= quiet_ms and (now - activity) * 1000 >= min_ms:
                return Settled(last, (now - start) * 1000, True)
            left_ms = timeout_ms - (now - start) * 1000
            if left_ms <= 0:
                return Settled(last, (now - start) * 1000, False)
            # Never sleep past the cap: the answer comes at most one grab after timeout_ms.
            await asyncio.sleep(min(poll_ms, left_ms) / 1000)
            frame = await self.grab()
            if frame.data != last.data:
                last, last_change = frame, time.monotonic()

    def _encode(
        self,
        frame: Frame,
        fmt: ImageFormat,
        quality: int | None,
        region: Region | None,
        width: int | None,
        scale: float | None,
        cursor: bool,
    ) -> EncodedImage:
        image = enc.frame_to_image(frame)
        pointer: CursorImage | None = self._capture.cursor() if cursor else None
        if pointer is not None:
            image = enc.overlay_cursor(image, pointer)
        return enc.encode(image, fmt, quality=quality, region=region, width=width, scale=scale)

    async def encode(
        self,
        frame: Frame,
        fmt: ImageFormat = "png",
        *,
        quality: int | None = None,
        region: Region | None = None,
        width: int | None = None,
        scale: float | None = None,
        cursor: bool = False,
        settled: Settled | None = None,
    ) -> EncodedImage:
        image: EncodedImage = await self._on_thread(self._encode, frame, fmt, quality, region, width, scale, cursor)
        if settled is not None:
            image = dataclasses.replace(image, settle_ms=settled.settle_ms, settled=settled.settled)
        return image

    def close(self) -> None:
        self._pool.submit(self._capture.close).result()
        self._pool.shutdown()
