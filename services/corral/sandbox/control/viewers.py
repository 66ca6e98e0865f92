"""The controller's live streams (``WS /v1/live?viewer=<actor>&mode=view|control``): frames out, the
lease's changes out, and in control mode a human's take, release and input.

The wire (design15.md, relayed unchanged by the gateway):

- out, text: ``hello`` (viewer, mode, screen, lease), ``lease`` on every change of the lease, and an
  ``ack`` or ``error`` answering each message that has a ``seq``;
- out, binary: one JPEG frame (:mod:`corral.sandbox.control.live`);
- in (control mode only; view mode gets ``forbidden``): ``take``, ``release`` (``note``?) and
  ``input`` (``action``: a native action of :data:`~corral.protocol.actions.HUMAN_INPUT`).

A viewer's messages run one after another in the order they came. Input runs through
:meth:`Desktop.run` under :attr:`Desktop.lock` (the agent's XTest path), only while the viewer holds
the lease; the proxy learns it as action ``h<n>.<boot>`` with the viewer as its actor, and the
recording keeps it as an ``action`` event of dialect ``human`` (neither for a ``move``: a pointer
sends dozens a second, and a move makes no request).

What a stream sends waits in a bounded outbox: a viewer that sends without reading what comes back
is closed (1008) rather than queued for; a message over :data:`MAX_MESSAGE_BYTES` closes it (1009).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.contracts.actors import AGENT, is_human
from corral.errors import ActionError, ErrorCode
from corral.frames import next_frame, over_limit
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.protocol.geometry import Size, check_bounds
from corral.protocol.plan import After
from corral.protocol.validation import validate
from corral.sandbox.agent.freezer import AgentFreezer
from corral.sandbox.control.lease import Change
from corral.sandbox.control.live import LiveStream, LiveView
from corral.sandbox.desktop import Desktop
from corral.sandbox.egress import ActionReporter
from corral.sandbox.recorder import ActionEvent, Recorder

log = logging.getLogger(__name__)

Mode = Literal["view", "control"]
MODES: tuple[Mode, ...] = ("view", "control")
# ``agent`` (the session token watching), ``human:<link id>`` or ``human:owner``, ``cdp:<conn>``.
VIEWER = re.compile(r"agent|(human|cdp):[A-Za-z0-9_.-]{1,60}")


def admitted(viewer: str, mode: str) -> bool:
    """Whether the live route serves ``viewer`` in ``mode``: the agent only watches (its stream
    must never be attached to, or detached from, the lease)."""
    return VIEWER.fullmatch(viewer) is not None and mode in MODES and not (viewer == AGENT and mode == "control")


MAX_MESSAGE_BYTES = 1 << 20  # a paste of up to a MiB
NOTE_MAX_CHARS = 2000
HUMAN_TIMEOUT_S = 30.0
# What an input causes comes after it returns (a click's navigation, a typed search's requests): its
# action stays in flight for the proxy this long after, as a CDP connection's window does.
TAIL_S = 1.0
MAX_PENDING = 256  # a viewer's messages waiting to run
# Texts waiting to be sent to a viewer (acks, errors, lease changes; a few hundred bytes each): room
# for a burst of input answered while the viewer reads on (a few thousand), not for one that never reads.
MAX_OUTBOX = 4096
DIALECT = "human"


# -- the wire, viewer to controller (pure)


@dataclass(frozen=True, slots=True)
class Take:
    seq: int | None


@dataclass(frozen=True, slots=True)
class Release:
    seq: int | None
    note: str | None


@dataclass(frozen=True, slots=True)
class Input:
    seq: int | None
    action: a.NativeAction


@dataclass(frozen=True, slots=True)
class Refused:
    """A viewer message that cannot be run: its ``seq`` (if it could be read) and why."""

    seq: int | None
    error: ActionError


Message = Take | Release | Input


def parse(raw: str | bytes, screen: Size) -> Message | Refused:
    """One viewer message, checked (an input's action against ``screen``), or why it is refused."""
    if len(raw) > MAX_MESSAGE_BYTES:
        return Refused(None, ActionError(ErrorCode.MESSAGE_TOO_LARGE, f"at most {MAX_MESSAGE_BYTES} bytes"))
    try:
        body = json.loads(raw)
    except ValueError as exc:
        return Refused(None, ActionError(ErrorCode.INVALID_JSON, f"the message is not JSON: {exc}"))
    except RecursionError:  # a MiB of brackets nests past the parser's recursion
        return Refused(None, ActionError(ErrorCode.INVALID_JSON, "the message nests too deep"))
    if not isinstance(body, dict):
        return Refused(None, ActionError(ErrorCode.INVALID_REQUEST, "a message is a JSON object"))
    seq = body.get("seq")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 0):
        return Refused(None, ActionError(ErrorCode.INVALID_FIELD, "seq is a whole number >= 0", field="seq"))
    try:
        return _message(body, seq, screen)
    except ActionError as exc:
        return Refused(seq, exc)


def _message(body: dict[str, object], seq: int | None, screen: Size) -> Message:
    kind = body.get("type")
    if kind == "take":
        return Take(seq)
    if kind == "release":
        return Release(seq, _note(body.get("note")))
    if kind == "input":
        return Input(seq, human_action(body.get("action"), screen))
    if kind is None:
        raise ActionError(ErrorCode.MISSING_FIELD, "the message has no 'type'", field="type")
    raise ActionError(ErrorCode.INVALID_FIELD, f"unknown message type {kind!r}: take, release or input", "type")


def _note(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > NOTE_MAX_CHARS:
        raise ActionError(ErrorCode.INVALID_FIELD, f"note is text of at most {NOTE_MAX_CHARS} characters", "note")
    return value or None


def human_action(value: object, screen: Size) -> a.NativeAction:
    """A viewer's ``action``: a native action a human may send, on the screen; fields under ``action.``."""
    if value is None:
        raise ActionError(ErrorCode.MISSING_FIELD, "an input carries an 'action'", field="action")
    action = validate(a.native_action(), value, "action", tagged=True)
    if not isinstance(action, a.HUMAN_INPUT):
        raise ActionError(
            ErrorCode.FORBIDDEN, f"a viewer sends pointer and key input, not {action.type!r}", field="action.type"
        )
    check_bounds(action, screen, "action")
    return action


# -- the wire, controller to viewer


class _Text(BaseModel):
    """A text message to a viewer, its ``type`` first."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ScreenSize(_Text):
    width: int
    height: int


class Hello(_Text):
    type: Literal["hello"] = "hello"
    viewer: str
    mode: Mode
    screen: ScreenSize
    lease: r.LeaseView


class Ack(_Text):
    type: Literal["ack"] = "ack"
    seq: int | None


class Failed(_Text):
    type: Literal["error"] = "error"
    seq: int | None
    error: r.ErrorBody


class LeaseChanged(_Text):
    type: Literal["lease"] = "lease"
    lease: r.LeaseView


ViewerText = Hello | Ack | Failed | LeaseChanged


def hello(viewer: str, mode: Mode, desktop: Desktop) -> Hello:
    size = ScreenSize(width=desktop.size.width, height=desktop.size.height)
    return Hello(viewer=viewer, mode=mode, screen=size, lease=desktop.lease.state().view())


def ack(seq: int | None) -> Ack:
    return Ack(seq=seq)


def failed(seq: int | None, error: ActionError) -> Failed:
    return Failed(seq=seq, error=r.ErrorBody.model_validate(error.to_dict()))


# -- human input


class HumanInput:
    """Runs viewers' input on the desktop, reported to the proxy and recorded. One per controller."""

    def __init__(
        self,
        desktop: Desktop,
        reporter: ActionReporter | None,
        recorder: Recorder | None,
        freezer: AgentFreezer | None = None,
    ) -> None:
        self._desktop = desktop
        self._reporter = reporter
        self._recorder = recorder
        self.freezer = freezer  # the agent's processes stopped before a human's input runs
        self._seq = 0
        self._boot = secrets.token_hex(2)  # ids stay unique in the audit log across controller restarts
        # action id -> its viewer and the task that reports its end TAIL_S later
        self._tails: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._closing = False  # shutdown began: no input runs, no tail is started

    @property
    def tailing(self) -> int:
        """How many inputs the proxy still counts as in flight (each for :data:`TAIL_S` after it ran)."""
        return len(self._tails)

    async def run(self, viewer: str, action: a.NativeAction) -> r.AnyResult | None:
        """The action's result; :class:`ActionError` (``control_taken`` first) when it cannot run."""
        self._refuse_if_closing()
        self._desktop.lease.check(viewer)
        if self.freezer is not None:
            await self.freezer.frozen_for_human()
            self._desktop.lease.check(viewer)  # handed back while the freeze ran
        self._seq += 1
        action_id = f"h{self._seq}.{self._boot}"
        started, wall = time.perf_counter(), time.time()
        recorder = None if isinstance(action, a.Move) else self._recorder
        number = recorder.arrived() if recorder is not None else None
        if recorder is not None:
            await recorder.before_action()
        error: ActionError | None = None
        result: r.AnyResult | None = None
        try:
            result = await self._run(viewer, action_id, action)
        except ActionError as exc:
            error = exc
        except Exception:
            log.exception("a viewer's %s failed", action.type)
            error = ActionError(ErrorCode.INTERNAL, "internal error; see the controller log")
        if recorder is not None:
            elapsed_ms = (time.perf_counter() - started) * 1000
            recorder.record(_event(viewer, action_id, action, result, error, wall, elapsed_ms, number))
        if error is not None:
            raise error
        return result

    async def _run(self, viewer: str, action_id: str, action: a.NativeAction) -> r.AnyResult:
        try:
            async with asyncio.timeout(HUMAN_TIMEOUT_S), self._desktop.lock:
                # Taken back while this waited for the lock: the new holder's, not this viewer's, turn.
                self._desktop.lease.check(viewer)
                self._refuse_if_closing()
                if isinstance(action, a.Move):  # causes no request: the proxy need not hear of it
                    return (await self._desktop.run(action, After())).result
                if self._reporter is not None:
                    await self._reporter.started(action_id, actor=viewer)
                acts = self._desktop.browser.downloads.acts  # a download that begins now is this person's
                acts.native_started(action_id, action.type, actor=viewer)
                try:
                    return (await self._desktop.run(action, After())).result
                finally:
                    acts.native_ended(action_id)
                    await self._end_later(action_id, viewer)
        except TimeoutError:
            raise ActionError(ErrorCode.TIMEOUT, f"the input did not run within {HUMAN_TIMEOUT_S:.0f} s") from None

    def _refuse_if_closing(self) -> None:
        if self._closing:
            raise ActionError(ErrorCode.UNSUPPORTED, "the controller is shutting down")

    async def _end_later(self, action_id: str, viewer: str) -> None:
        if self._reporter is None:
            return
        if self._closing:  # close() ended the tails already: no new one outlives it
            await self._reporter.ended(action_id, actor=viewer)
        else:
            task = asyncio.create_task(self._end(action_id, viewer, TAIL_S))
            self._tails[action_id] = (viewer, task)

    async def _end(self, action_id: str, viewer: str, after_s: float) -> None:
        assert self._reporter is not None
        await asyncio.sleep(after_s)
        self._tails.pop(action_id, None)
        await self._reporter.ended(action_id, actor=viewer)

    async def close(self) -> None:
        """Shutdown: every input still in its tail ended now; no input runs after."""
        self._closing = True
        tails, self._tails = self._tails, {}
        for _, task in tails.values():
            task.cancel()
        await asyncio.gather(*(task for _, task in tails.values()), return_exceptions=True)
        if self._reporter is not None:
            for action_id, (viewer, _) in tails.items():
                await self._reporter.ended(action_id, actor=viewer)


def _event(
    viewer: str,
    action_id: str,
    action: a.NativeAction,
    result: r.AnyResult | None,
    error: ActionError | None,
    wall: float,
    elapsed_ms: float,
    number: int | None,
) -> ActionEvent:
    """The recording's ``action`` event (the shape Dispatcher's Handled.event gives), with its actor; its
    request is the native envelope a replay sends again."""
    native = action.model_dump(mode="json", exclude_none=True)
    data = {} if result is None else result.wire()
    reply: Mapping[str, object] = (
        {"ok": True, "action_id": action_id, "result": data}
        if error is None
        else {"ok": False, "action_id": action_id, "error": error.to_dict()}
    )
    return ActionEvent(
        action_id=action_id,
        request_seq=number,
        started=wall,
        elapsed_ms=round(elapsed_ms, 3),
        dialect=DIALECT,
        actor=viewer,
        request={"action": native},
        native=[native],
        ok=error is None,
        url=None,
        title=None,
        error=None if error is None else error.to_dict(),
        reply=reply,
    )


# -- streams


class Viewers:
    """The controller's live streams: the one :class:`LiveView`, the human input runner, and which
    viewers are attached to the lease (one viewer may have several streams open)."""

    def __init__(self, desktop: Desktop, live: LiveView, humans: HumanInput) -> None:
        self.desktop = desktop
        self.live = live
        self.humans = humans
        self._open: dict[str, int] = {}
        self._sessions: set[ViewerSession] = set()

    def attached(self, viewer: str) -> None:
        count = self._open.get(viewer, 0)
        self._open[viewer] = count + 1
        if count == 0:
            self.desktop.lease.attach(viewer)

    def detached(self, viewer: str) -> None:
        if viewer not in self._open:
            return  # detached already (at shutdown)
        count = self._open[viewer] - 1
        if count > 0:
            self._open[viewer] = count
            return
        self._open.pop(viewer, None)
        # Its last stream closed: a lease it held goes back (``left``).
        self.desktop.lease.detach(viewer)

    async def serve(self, websocket: WebSocket, viewer: str, mode: Mode) -> None:
        session = ViewerSession(self, websocket, viewer, mode)
        self._sessions.add(session)
        try:
            await session.serve()
        finally:
            self._sessions.discard(session)

    async def close(self) -> None:
        """Shutdown: every viewer detached from the lease now (the change recorded while the recorder
        still listens), every stream closed (1001, going away), the polling stopped."""
        for viewer in list(self._open):
            self._open.pop(viewer)
            self.desktop.lease.detach(viewer)
        for session in list(self._sessions):
            await session.close()
        await self.live.close()
        await self.humans.close()


class ViewerSession:
    """One open stream: a writer for text, one for frames, a worker running messages in order."""

    def __init__(self, viewers: Viewers, websocket: WebSocket, viewer: str, mode: Mode) -> None:
        self._viewers = viewers
        self._desktop = viewers.desktop
        self._websocket = websocket
        self._viewer = viewer
        self._mode = mode
        self._sending = asyncio.Lock()
        self._outbox: asyncio.Queue[ViewerText] = asyncio.Queue()
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._overflowed = asyncio.Event()  # the viewer does not read what it is sent

    async def serve(self) -> None:
        control = self._mode == "control"
        if control:
            self._viewers.attached(self._viewer)
        try:
            await self._serve()
        finally:
            if control:
                self._viewers.detached(self._viewer)

    async def _serve(self) -> None:
        # Hello first (before any frame), then every change from the state it shows: subscribed in the
        # same step, so a change while hello is being sent waits behind it.
        unsubscribe = self._desktop.lease.subscribe(self._lease_changed)
        self._queue(hello(self._viewer, self._mode, self._desktop))
        stream: LiveStream | None = None
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._send_text(self._outbox.get_nowait())
            stream = self._viewers.live.open()
            tasks = [
                asyncio.create_task(self._write_texts()),
                asyncio.create_task(self._write_frames(stream)),
                asyncio.create_task(self._work()),
                asyncio.create_task(self._close_on_overflow()),
            ]
            await self._read()
        finally:
            unsubscribe()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if stream is not None:
                await stream.close()

    async def close(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self._websocket.close(1001, "the controller is shutting down")

    def _lease_changed(self, change: Change) -> None:
        self._queue(LeaseChanged(lease=change.state.view()))

    def _queue(self, message: ViewerText) -> None:
        """``message`` to be sent; past :data:`MAX_OUTBOX` waiting, the stream is to close instead."""
        if self._outbox.qsize() >= MAX_OUTBOX:
            self._overflowed.set()
            return
        self._outbox.put_nowait(message)

    async def _close_on_overflow(self) -> None:
        await self._overflowed.wait()
        await self._close(1008, "the viewer does not read what it is sent")

    async def _close(self, code: int, reason: str) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self._websocket.close(code, reason)

    async def _read(self) -> None:
        with contextlib.suppress(WebSocketDisconnect):
            while (raw := await next_frame(self._websocket)) is not None:
                if over_limit(raw, MAX_MESSAGE_BYTES):  # uvicorn takes CDP's 64 MiB frames on every route
                    await self._close(1009, f"a message is at most {MAX_MESSAGE_BYTES} bytes")
                    return
                self._take(parse(raw, self._desktop.size))
                if self._overflowed.is_set():
                    await self._close(1008, "the viewer does not read what it is sent")
                    return

    def _take(self, parsed: Message | Refused) -> None:
        """A message read: queued to run, or answered with why not."""
        if isinstance(parsed, Refused):
            self._queue(failed(parsed.seq, parsed.error))
        elif self._mode != "control":
            refused = ActionError(ErrorCode.FORBIDDEN, "a view-only stream cannot take control or send input")
            self._queue(failed(parsed.seq, refused))
        elif self._inbox.qsize() >= MAX_PENDING:
            # Input far faster than the desktop runs it (a stuck page, a flooding client): refused
            # rather than queued without bound.
            busy = ActionError(ErrorCode.INVALID_REQUEST, f"over {MAX_PENDING} messages wait to run; slow down")
            self._queue(failed(parsed.seq, busy))
        else:
            self._inbox.put_nowait(parsed)

    async def _work(self) -> None:
        while True:
            message = await self._inbox.get()
            try:
                await self._run(message)
            except ActionError as exc:
                self._queue(failed(message.seq, exc))
            else:
                self._queue(ack(message.seq))

    async def _run(self, message: Message) -> None:
        lease = self._desktop.lease
        if isinstance(message, Take):
            if not is_human(self._viewer):
                raise ActionError(ErrorCode.FORBIDDEN, "only a human viewer takes control")
            lease.take(self._viewer)
            freezer = self._viewers.humans.freezer
            if freezer is not None:  # answered once no process of the agent's runs any more
                await freezer.frozen_for_human()
        elif isinstance(message, Release):
            lease.release(self._viewer, message.note)
        else:
            await self._viewers.humans.run(self._viewer, message.action)

    async def _write_texts(self) -> None:
        while True:
            await self._send_text(await self._outbox.get())

    async def _send_text(self, message: ViewerText) -> None:
        async with self._sending:
            await self._websocket.send_text(json.dumps(message.model_dump(mode="json"), separators=(",", ":")))

    async def _write_frames(self, stream: LiveStream) -> None:
        while True:
            frame = await stream.next()
            async with self._sending:
                await self._websocket.send_bytes(frame)
