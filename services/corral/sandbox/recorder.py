"""The controller's side of session recording: one event per request, with a small frame after it
(and, without one, an event per change of the control lease: :meth:`Recorder.note`).

Each event holds the request as received, its native form, the reply (images left out; the bytes
of commands and file operations cut by :func:`corral.recording.redact.redact`), timings,
the browser's URL and title, and a WebP frame of the screen right after the action. Events wait
in a bounded buffer until the gateway fetches them (``GET /v1/recording``, long-polled), and the
gateway writes the bundle as the session goes. The frame is grabbed once the reply has been built;
it is encoded on a thread of its own, off the capture thread and off the reply's path.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import re
import secrets
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NotRequired, TypedDict

from corral.recording.redact import redact
from corral.sandbox.desktop import Desktop
from corral.sandbox.display import encode as enc
from corral.sandbox.display.xcapture import Frame
from corral.sandbox.web.tabs import PICK_BOUND_S

log = logging.getLogger(__name__)

FRAME_WIDTH = 640
FRAME_QUALITY = 60
SETTLE_QUIET_MS, SETTLE_TIMEOUT_MS, SETTLE_POLL_MS = 120, 1500, 15
SKIP_WITHIN_MS = 100
# How long an event waits for the page's URL and title: the active tab's choice (its questions bounded
# by PICK_BOUND_S) and the title read, on a machine that may be loaded. Only this event's publication
# waits (each event completes in a task of its own), never an action. At 1 s, a choice between two tabs
# on a loaded machine was cut short and the event lost its title (docs/design/0411).
PAGE_READ_S = PICK_BOUND_S + 3.0
BUFFER = 512  # events kept for the gateway; older ones are dropped (the gateway notes the gap)
BUFFER_BYTES = 32 << 20  # and at most this much of their frames and text, whichever is reached first


class ActionEvent(TypedDict):
    """One request as :meth:`Recorder.record` takes it (the dispatcher's, a viewer's input, an HTTP
    file transfer), in the order its keys are kept."""

    action_id: str | None  # the egress audit log's name for it (None: it made no request through the proxy)
    request_seq: int | None  # its place in the order requests came in
    started: float  # unix seconds
    elapsed_ms: float
    dialect: str | None
    actor: NotRequired[str]  # a viewer's input: the viewer
    request: object  # as read: any JSON, or its text when it could not be read
    native: Sequence[Mapping[str, object]] | None  # its native steps, as JSON
    ok: bool
    url: str | None
    title: str | None
    error: Mapping[str, object] | None
    reply: Mapping[str, object]


class RecordingPage(TypedDict):
    """``GET /v1/recording``'s answer: the events after the asked ``seq``, the oldest still kept,
    the newest number given, and which run of the controller numbered them."""

    events: list[dict[str, Any]]
    oldest: int
    last: int
    boot: str


def _is_image(key: str, value: Any) -> bool:
    # Native and Anthropic replies carry base64 under "data"; OpenAI's a data: URL under "image_url".
    return isinstance(value, str) and len(value) > 256 and (key == "data" or value.startswith("data:"))


def _strip_images(value: Any) -> Any:
    """A reply without its image payloads (the frame stands in for them)."""
    if isinstance(value, dict):
        return {k: ("<image>" if _is_image(k, v) else _strip_images(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_images(item) for item in value]
    return value


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_safe(value: Any) -> Any:
    """``value`` as strict JSON can carry it: a lone surrogate (a request may hold ``"\\ud800"``) becomes
    U+FFFD and a non-finite number null, so ``GET /v1/recording`` never fails on what an agent sent."""
    if isinstance(value, str):
        return value if value.isascii() else _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _size(event: Mapping[str, object]) -> int:
    # Frames and text alike: requests of up to a MiB each would otherwise make one answer to the
    # gateway hundreds of MiB (it reads at most 64 MiB of one). ASCII JSON is at least the UTF-8 size.
    return len(json.dumps(event, default=str))


async def _without_frame(event: dict[str, Any]) -> dict[str, Any]:
    event["frame_skipped"] = "a file transfer over HTTP does not touch the screen"
    return event


class Recorder:
    """The events kept for the gateway. Once recorded, an event is a JSON document (the request as
    sent, the reply with a vendor's own blocks, what redaction and completion add): held as such."""

    def __init__(self, desktop: Desktop) -> None:
        self._desktop = desktop
        self._events: deque[dict[str, Any]] = deque()
        self._seq = 0  # events, numbered as they end (the order the gateway reads them in)
        self._arrived = 0  # requests, numbered as they come in (the order a replay sends them in)
        self._bytes = 0  # of the kept events' frames
        # Which run of this controller numbered the events: a restarted one starts again from 1.
        self.boot = secrets.token_hex(8)
        self._changed = asyncio.Condition()
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-record")
        self._pending: asyncio.Queue[asyncio.Future[dict[str, Any]]] = asyncio.Queue()
        self._publisher: asyncio.Task[None] | None = None
        self._next_request = asyncio.Event()  # set when a request starts: the newest frame stops settling

    def arrived(self) -> int:
        """The next request's number in the order requests came in (an event's ``request_seq``):
        events are numbered when they end, so a ``process_kill`` sent while its ``exec`` ran ends, and
        is numbered, first; a replay sends them in this order instead."""
        self._arrived += 1
        return self._arrived

    async def before_action(self) -> None:
        """A request is about to run: a frame still settling stops at the screen as it is now."""
        self._next_request.set()

    async def _settled_frame(self, already: bool = False) -> tuple[Frame | None, bool]:
        """The screen once quiet for a moment, as a replay will settle it, so the two compare. In the
        background, so the agent never waits for it; if its next request comes first, the frame is
        the last one grabbed (at most one poll old): the screen that request started from."""
        screen = self._desktop.screen
        self._next_request = interrupt = asyncio.Event()
        if already:
            # The reply's own screenshot waited for a settled screen: this is it, taken once.
            return await screen.grab(), True
        with contextlib.suppress(TimeoutError):
            # Nothing is grabbed (no CPU, no GIL) until the session has paused for a moment.
            async with asyncio.timeout(SKIP_WITHIN_MS / 1000):
                await interrupt.wait()
        if interrupt.is_set():
            return None, False
        start = last_change = time.monotonic()
        last = await screen.grab()
        while True:
            now = time.monotonic()
            if (now - last_change) * 1000 >= SETTLE_QUIET_MS:
                return last, True
            if (now - start) * 1000 >= SETTLE_TIMEOUT_MS or interrupt.is_set():
                return last, False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SETTLE_POLL_MS / 1000):
                    await interrupt.wait()
            if interrupt.is_set():
                return last, False
            frame = await screen.grab()
            if frame.data != last.data:
                last, last_change = frame, time.monotonic()

    def record(self, recorded: ActionEvent, *, frame: bool = True) -> None:
        """Queue one event; its frame and page state are added in the background (``frame``: an
        event that does not touch the screen, a file transfer over HTTP, gets neither)."""
        self._seq += 1
        # Uploaded bytes and long outputs never enter the buffer whole: a prefix, a size and a sha256.
        event = redact(dict(recorded))
        event = {"seq": self._seq, **event, "reply": _strip_images(event.get("reply"))}
        completing = self._complete(event) if frame else _without_frame(event)
        self._queue(asyncio.create_task(completing))

    def note(self, event: Mapping[str, object]) -> None:
        """Queue an event that is no request (a change of the control lease: ``{"event": "control",
        ...}``), in order with the requests' events, as it is: no frame, no page state, no reply."""
        self._seq += 1
        noted: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        noted.set_result({"seq": self._seq, **event, "at": time.time()})
        self._queue(noted)

    def _queue(self, completing: asyncio.Future[dict[str, Any]]) -> None:
        self._pending.put_nowait(completing)
        if self._publisher is None:
            self._publisher = asyncio.create_task(self._publish())

    async def _publish(self) -> None:
        # Completed in parallel, published in order: the gateway reads events by increasing seq.
        while True:
            # Made safe once complete: the page's title and URL are added last, and a page may set either.
            event = _json_safe(await (await self._pending.get()))
            async with self._changed:
                if len(self._events) == BUFFER:
                    self._forget()
                self._events.append(event)
                self._bytes += _size(event)
                while self._bytes > BUFFER_BYTES and len(self._events) > 1:
                    self._forget()
                self._changed.notify_all()

    def _forget(self) -> None:
        dropped = self._events.popleft()
        self._bytes -= _size(dropped)

    async def _complete(self, event: dict[str, Any]) -> dict[str, Any]:
        try:
            shot = (event.get("reply") or {}).get("screenshot") or {}
            frame, event["frame_settled"] = await self._settled_frame(already=shot.get("settled") is True)
            event["frame_at"] = time.time()
            if frame is None:
                # Requests in quick succession (a script, not an agent looking): a frame each would cost
                # more CPU than the requests themselves. The next one's frame shows the outcome.
                event["frame_skipped"] = f"the next request came within {SKIP_WITHIN_MS} ms"
                return event
            loop = asyncio.get_running_loop()
            event["frame_webp"] = await loop.run_in_executor(self._encoder, self._encode, frame)
        except Exception as exc:  # a frame is a nice-to-have; the event itself must not be lost
            log.warning("no frame for recorded event %s: %s", event["seq"], exc)
        if event.get("title") is None:
            # Read once the action is done; on a page that changes its title late, it may be that later one.
            # From what is at hand: a click's event must not start the Playwright driver just for this.
            try:
                async with asyncio.timeout(PAGE_READ_S):
                    info = await self._desktop.browser.info_at_hand()
                # Both from the one read: the URL at the action's end may be another tab's (a popup it opened).
                event["title"] = info.get("title")
                event["url"] = info.get("url") or event.get("url")
            except Exception:
                event["title"] = None
        return event

    @staticmethod
    def _encode(frame: Frame) -> str:
        image = enc.frame_to_image(frame)
        width = min(FRAME_WIDTH, image.width)
        encoded = enc.encode(image, "webp", quality=FRAME_QUALITY, width=width)
        return base64.b64encode(encoded.data).decode()

    async def after(self, seq: int, wait_ms: int) -> RecordingPage:
        """Events after ``seq`` (waiting up to ``wait_ms`` for one), and the oldest still kept."""
        async with self._changed:
            if not any(e["seq"] > seq for e in self._events) and wait_ms > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_ms / 1000):
                        await self._changed.wait_for(lambda: any(e["seq"] > seq for e in self._events))
            events = sorted((e for e in self._events if e["seq"] > seq), key=lambda e: e["seq"])
            oldest = self._events[0]["seq"] if self._events else self._seq + 1
        return RecordingPage(events=events, oldest=oldest, last=self._seq, boot=self.boot)

    async def close(self) -> None:
        if self._publisher is not None:
            self._publisher.cancel()
            await asyncio.gather(self._publisher, return_exceptions=True)
        self._encoder.shutdown(wait=False)
