"""The controller's live streams (``WS /v1/live?viewer=<actor>&mode=view|control``): frames out, the
lease's changes out, and in control mode a human's take, release and input.

The wire (design15.md, relayed unchanged by the gateway):

- out, text: ``hello`` (viewer, mode, screen, lease), ``lease`` on every change of the lease, and an
  ``ack`` or ``error`` answering each message that has a ``seq``;
- out, binary: one JPEG frame (:mod:`corral.sandbox.live`);
- in (control mode only; view mode gets ``forbidden``): ``take``, ``release`` (``note``?) and
  ``input`` (``action``: a native action of :data:`~corral.protocol.actions.HUMAN_INPUT`).

A viewer's messages run one after another in the order they came. Input runs through
:meth:`Desktop.run` under :attr:`Desktop.lock` (the agent's XTest path), only while the viewer holds
the lease; the proxy learns it as action ``h<n>.<boot>`` with the viewer as its actor, and the
recording keeps it (not a ``move``: a pointer sends dozens a second) as an ``action`` event of
dialect ``human``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import TypeAdapter
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol.geometry import Size, check_bounds
from corral.protocol.plan import After
from corral.protocol.validation import validate
from corral.sandbox.desktop import Desktop
from corral.sandbox.egress import ActionReporter
from corral.sandbox.lease import Change, is_human
from corral.sandbox.live import LiveStream, LiveView
from corral.sandbox.recorder import Recorder

log = logging.getLogger(__name__)

Mode = Literal["view", "control"]
MODES: tuple[Mode, ...] = ("view", "control")
# ``agent`` (the session token watching), ``human:<link or key id>``, ``cdp:<conn>``.
VIEWER = re.compile(r"agent|(human|cdp):[A-Za-z0-9_.-]{1,60}")
MAX_MESSAGE_BYTES = 1 << 20  # a paste of up to a MiB
NOTE_MAX_CHARS = 2000
HUMAN_TIMEOUT_S = 30.0
MAX_PENDING = 256  # a viewer's messages waiting to run
DIALECT = "human"

_ACTION: TypeAdapter[a.NativeAction] = TypeAdapter(a.NativeAction)


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
    if not isinstance(body, dict):
        return Refused(None, ActionError(ErrorCode.INVALID_REQUEST, "a message is a JSON object"))
    seq = body.get("seq")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 0):
        return Refused(None, ActionError(ErrorCode.INVALID_FIELD, "seq is a whole number >= 0", field="seq"))
    try:
        return _message(body, seq, screen)
    except ActionError as exc:
        return Refused(seq, exc)


def _message(body: dict[str, Any], seq: int | None, screen: Size) -> Message:
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


def _note(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > NOTE_MAX_CHARS:
        raise ActionError(ErrorCode.INVALID_FIELD, f"note is text of at most {NOTE_MAX_CHARS} characters", "note")
    return value or None


def human_action(value: Any, screen: Size) -> a.NativeAction:
    """A viewer's ``action``: a native action a human may send, on the screen; fields under ``action.``."""
    if value is None:
        raise ActionError(ErrorCode.MISSING_FIELD, "an input carries an 'action'", field="action")
    action = validate(_ACTION, value, "action", tagged=True)
    if not isinstance(action, a.HUMAN_INPUT):
        raise ActionError(
            ErrorCode.FORBIDDEN, f"a viewer sends pointer and key input, not {action.type!r}", field="action.type"
        )
    check_bounds(action, screen, "action")
    return action


# -- the wire, controller to viewer


def hello(viewer: str, mode: Mode, desktop: Desktop) -> dict[str, Any]:
    size = desktop.size
    return {
        "type": "hello",
        "viewer": viewer,
        "mode": mode,
        "screen": {"width": size.width, "height": size.height},
        "lease": desktop.lease.state().as_dict(),
    }


def ack(seq: int | None) -> dict[str, Any]:
    return {"type": "ack", "seq": seq}


def failed(seq: int | None, error: ActionError) -> dict[str, Any]:
    return {"type": "error", "seq": seq, "error": error.to_dict()}


# -- human input


class HumanInput:
    """Runs viewers' input on the desktop, reported to the proxy and recorded. One per controller."""

    def __init__(self, desktop: Desktop, reporter: ActionReporter | None, recorder: Recorder | None) -> None:
        self._desktop = desktop
        self._reporter = reporter
        self._recorder = recorder
        self._seq = 0
        self._boot = secrets.token_hex(2)  # ids stay unique in the audit log across controller restarts

    async def run(self, viewer: str, action: a.NativeAction) -> dict[str, Any]:
        """The action's result; :class:`ActionError` (``control_taken`` first) when it cannot run."""
        self._desktop.lease.check(viewer)
        self._seq += 1
        action_id = f"h{self._seq}.{self._boot}"
        started, wall = time.perf_counter(), time.time()
        recorder = None if isinstance(action, a.Move) else self._recorder
        number = recorder.arrived() if recorder is not None else None
        if recorder is not None:
            await recorder.before_action()
        error: ActionError | None = None
        data: dict[str, Any] = {}
        try:
            data = await self._run(viewer, action_id, action)
        except ActionError as exc:
            error = exc
        except Exception:
            log.exception("a viewer's %s failed", action.type)
            error = ActionError(ErrorCode.INTERNAL, "internal error; see the controller log")
        if recorder is not None:
            elapsed_ms = (time.perf_counter() - started) * 1000
            recorder.record(_event(viewer, action_id, action, data, error, wall, elapsed_ms, number))
        if error is not None:
            raise error
        return data

    async def _run(self, viewer: str, action_id: str, action: a.NativeAction) -> dict[str, Any]:
        try:
            async with asyncio.timeout(HUMAN_TIMEOUT_S), self._desktop.lock:
                # Taken back while this waited for the lock: the new holder's, not this viewer's, turn.
                self._desktop.lease.check(viewer)
                if self._reporter is not None:
                    await self._reporter.started(action_id, actor=viewer)
                try:
                    return (await self._desktop.run(action, After())).data
                finally:
                    if self._reporter is not None:
                        await self._reporter.ended(action_id, actor=viewer)
        except TimeoutError:
            raise ActionError(ErrorCode.TIMEOUT, f"the input did not run within {HUMAN_TIMEOUT_S:.0f} s") from None


def _event(
    viewer: str,
    action_id: str,
    action: a.NativeAction,
    data: dict[str, Any],
    error: ActionError | None,
    wall: float,
    elapsed_ms: float,
    number: int | None,
) -> dict[str, Any]:
    """The recording's ``action`` event (the shape Dispatcher's Handled.event gives), with its actor; its
    request is the native envelope a replay sends again."""
    native = action.model_dump(mode="json", exclude_none=True)
    reply: dict[str, Any] = (
        {"ok": True, "action_id": action_id, "result": data}
        if error is None
        else {"ok": False, "action_id": action_id, "error": error.to_dict()}
    )
    return {
        "action_id": action_id,
        "request_seq": number,
        "started": wall,
        "elapsed_ms": round(elapsed_ms, 3),
        "dialect": DIALECT,
        "actor": viewer,
        "request": {"action": native},
        "native": [native],
        "ok": error is None,
        "url": None,
        "title": None,
        "error": None if error is None else error.to_dict(),
        "reply": reply,
    }


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


class ViewerSession:
    """One open stream: a writer for text, one for frames, a worker running messages in order."""

    def __init__(self, viewers: Viewers, websocket: WebSocket, viewer: str, mode: Mode) -> None:
        self._viewers = viewers
        self._desktop = viewers.desktop
        self._websocket = websocket
        self._viewer = viewer
        self._mode = mode
        self._sending = asyncio.Lock()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()

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
        # Hello first (before any frame); lease changes from then on.
        await self._websocket.send_text(json.dumps(hello(self._viewer, self._mode, self._desktop)))
        unsubscribe = self._desktop.lease.subscribe(self._lease_changed)
        stream = self._viewers.live.open()
        tasks = [
            asyncio.create_task(self._write_texts()),
            asyncio.create_task(self._write_frames(stream)),
            asyncio.create_task(self._work()),
        ]
        try:
            await self._read()
        finally:
            unsubscribe()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await stream.close()

    async def close(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self._websocket.close(1001, "the controller is shutting down")

    def _lease_changed(self, change: Change) -> None:
        self._outbox.put_nowait({"type": "lease", "lease": change.state.as_dict()})

    async def _read(self) -> None:
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                message = await self._websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                raw = message.get("text")
                if raw is None:
                    raw = message.get("bytes") or b""
                parsed = parse(raw, self._desktop.size)
                if isinstance(parsed, Refused):
                    self._outbox.put_nowait(failed(parsed.seq, parsed.error))
                    continue
                if self._mode != "control":
                    refused = ActionError(ErrorCode.FORBIDDEN, "a view-only stream cannot take control or send input")
                    self._outbox.put_nowait(failed(parsed.seq, refused))
                    continue
                if self._inbox.qsize() >= MAX_PENDING:
                    # Input far faster than the desktop runs it (a stuck page, a flooding client):
                    # refused rather than queued without bound.
                    busy = ActionError(ErrorCode.INVALID_REQUEST, f"over {MAX_PENDING} messages wait to run; slow down")
                    self._outbox.put_nowait(failed(parsed.seq, busy))
                    continue
                self._inbox.put_nowait(parsed)

    async def _work(self) -> None:
        while True:
            message = await self._inbox.get()
            try:
                await self._run(message)
            except ActionError as exc:
                self._outbox.put_nowait(failed(message.seq, exc))
            else:
                self._outbox.put_nowait(ack(message.seq))

    async def _run(self, message: Message) -> None:
        lease = self._desktop.lease
        if isinstance(message, Take):
            if not is_human(self._viewer):
                raise ActionError(ErrorCode.FORBIDDEN, "only a human viewer takes control")
            lease.take(self._viewer)
        elif isinstance(message, Release):
            lease.release(self._viewer, message.note)
        else:
            await self._viewers.humans.run(self._viewer, message.action)

    async def _write_texts(self) -> None:
        while True:
            message = await self._outbox.get()
            async with self._sending:
                await self._websocket.send_text(json.dumps(message, separators=(",", ":")))

    async def _write_frames(self, stream: LiveStream) -> None:
        while True:
            frame = await stream.next()
            async with self._sending:
                await self._websocket.send_bytes(frame)
