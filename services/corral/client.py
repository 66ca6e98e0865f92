"""Clients for a sandbox's WebSocket protocol (``/v1/ws``), async and sync.

The control plane's SDK builds on these; tests and the benchmark use them directly.

Several requests may be in flight on one connection (a command streaming its output while a
screenshot is taken, or a ``process_kill`` of that command): every frame from the sandbox is sorted
by its ``id`` to the request that sent it. A reply has ``ok``; an event (``{"id", "event": "output",
...}``, sent before its request's reply) has none and is never taken for the reply. :meth:`stream`
gives a request's events, then its reply; :meth:`request` gives the reply alone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from types import TracebackType
from typing import Any, Literal, Self, TypedDict, TypeVar, Unpack, cast

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect as sync_connect

from corral.contracts import auth
from corral.errors import ActionFailed, UnprovenController

MAX_FRAME = 64 << 20


class Envelope(TypedDict, total=False):
    """A message's options besides its action (docs/protocol.md, "The envelope")."""

    screenshot: bool | Mapping[str, object]  # a screenshot after the action, in the reply
    wait_for: Literal["stable", "none"]
    settle_timeout_ms: int
    settle_quiet_ms: int
    settle_min_ms: int
    timeout_ms: int
    wait_for_control_ms: int


class DisplaySize(TypedDict):
    width: int
    height: int


class Request(Envelope, total=False):
    """One message to the sandbox: a native ``action`` or a vendor's call (``anthropic``, ``openai``),
    and its options. The action's fields depend on its ``type`` (fifty of them; the sandbox checks
    them) and a vendor call is the vendor's own JSON: open-ended here."""

    id: int | str
    action: Mapping[str, Any]
    anthropic: Mapping[str, Any]
    openai: Mapping[str, Any] | list[Mapping[str, Any]]
    display: DisplaySize
    acknowledge_safety_checks: bool


class Shot(TypedDict, total=False):
    """A reply's screenshot (base64)."""

    media_type: str
    data: str
    width: int
    height: int


class HandedBack(TypedDict):
    """A reply's ``control`` member: a human handed the control lease back."""

    by: str
    note: str | None
    at: float
    left: bool


class Frame(TypedDict, total=False):
    """A frame from the sandbox: a request's reply (it has ``ok``), or an event before it (``event``:
    a streamed command's output, with ``stream``, ``data``, ``encoding``). ``result`` is its action's
    (read by the action's model, corral.protocol.results) or a vendor call's; ``error`` is what
    :class:`ActionFailed` carries."""

    id: int | str | None
    ok: bool
    result: Any
    error: dict[str, Any]
    screenshot: Shot
    control: HandedBack
    elapsed_ms: float
    action_id: str
    event: str
    stream: str
    data: str
    encoding: str


class DialOptions(TypedDict):
    """How a connection is opened (``websockets``' ``connect`` keywords)."""

    compression: None
    max_size: int
    open_timeout: float
    additional_headers: dict[str, str] | None


# A reply as this client reads it, or as a caller that relays it untyped holds it (the gateway's HTTP route).
AnyReply = TypeVar("AnyReply", Frame, dict[str, Any])


def check_reply(reply: AnyReply) -> AnyReply:
    """The reply itself if it is ``ok``; raises :class:`ActionFailed` with its error if not."""
    if not reply.get("ok"):
        raise ActionFailed(reply.get("error") or {})
    return reply


def message(action: Mapping[str, Any], envelope: Envelope) -> Request:
    """A native action's message with its options."""
    return with_options({"action": action}, envelope)


def with_options(request: Request, envelope: Envelope) -> Request:
    """``request`` with ``envelope``'s options (which win)."""
    # Every key of an Envelope is one of a Request's; mypy cannot see it through ** (TypedDicts are open).
    return cast(Request, {**request, **envelope})


def _dial(secret: str | None, headers: dict[str, str] | None = None) -> tuple[DialOptions, auth.SignedRequest | None]:
    """The options of one connection (signed when straight to a controller; ``headers`` such as a
    gateway's ``Authorization``) and what it must prove. No per-message compression: it costs
    ~17 ms per screenshot frame for little gain."""
    signed = auth.sign(secret) if secret else None
    sent = {**(headers or {}), **(signed.headers if signed else {})}
    return DialOptions(compression=None, max_size=MAX_FRAME, open_timeout=10, additional_headers=sent or None), signed


def _check_proof(secret: str | None, signed: auth.SignedRequest | None, response: Any) -> None:
    """A direct connection to a controller: believe nothing until it proved the per-boot secret."""
    headers = response.headers if response is not None else {}
    if secret and signed is not None and not auth.proven(secret, signed.nonce, headers):
        raise UnprovenController("the sandbox's controller port answered without the controller's proof")


def is_reply(frame: Frame | dict[str, Any]) -> bool:
    """A request's final reply (it has ``ok``), not an event before it."""
    return "ok" in frame


def image_bytes(reply: Frame | dict[str, Any]) -> bytes:
    """The decoded screenshot of a native reply."""
    return base64.b64decode(reply["screenshot"]["data"])


RAW = object()  # the box of frames no request in flight claims, while a raw read waits for one
Box = int | object


# Frames a request's box holds before the reader waits for its consumer (an exec's output events are
# at most a chunk each): memory stays bounded however slowly a stream is read.
BOX_FRAMES = 64


class AsyncSandboxClient:
    """One WebSocket to a sandbox, its frames read by one task and sorted to the requests in flight.

    ``controller_secret``: for a connection straight to a sandbox's controller (tests, the bench); a
    session through the gateway carries its token in ``ws_url`` instead.
    """

    def __init__(self, ws_url: str, *, controller_secret: str | None = None) -> None:
        self._url = ws_url
        self._secret = controller_secret
        self._ws: ClientConnection | None = None
        self._ids = itertools.count(1)
        self._boxes: dict[Box, asyncio.Queue[Frame]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lost: BaseException | None = None  # why the connection ended, once it did

    async def __aenter__(self) -> Self:
        options, signed = _dial(self._secret)
        self._ws = await connect(self._url, **options)
        try:
            _check_proof(self._secret, signed, self._ws.response)
        except UnprovenController:
            with contextlib.suppress(ConnectionClosed, OSError):  # what answered need not close cleanly
                await self._ws.close()
            raise
        self._reader = asyncio.create_task(self._read(self._ws))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self, ws: ClientConnection) -> None:
        """Every frame to its request's box; one no request claims to a raw read, if one waits, else
        dropped (a late reply to a request given up on)."""
        try:
            async for message in ws:
                frame: Frame = json.loads(message)
                if not isinstance(frame, dict):
                    continue  # no reply nor event: nobody's
                box = self._boxes.get(frame.get("id"), self._boxes.get(RAW))
                if box is not None:
                    await box.put(frame)  # a full box waits: a slow consumer slows the socket, not memory
        except (ConnectionClosed, OSError, ValueError) as exc:  # handed to every waiter
            self._lost = exc
        finally:
            if self._lost is None:  # closed cleanly, or this client is closing
                closed = ws.protocol.state is State.CLOSED
                self._lost = ws.protocol.close_exc if closed else ConnectionClosed(None, None)
            for box in self._boxes.values():
                if not box.full():  # a full box's waiter reads on, and meets the end when it is empty
                    box.put_nowait(Frame())  # wakes its waiter, which then raises what ended the connection

    async def _next(self, box: Box) -> Frame:
        queue = self._boxes[box]
        if queue.empty() and self._lost is not None:
            raise self._lost
        frame = await queue.get()
        if not frame and self._lost is not None:
            raise self._lost
        return frame

    @contextlib.asynccontextmanager
    async def _opened(self, box: Box, message: str | bytes) -> AsyncIterator[None]:
        """``box`` registered (before ``message`` goes, so no frame can come too soon), then dropped."""
        assert self._ws is not None, "use `async with`"
        if self._lost is not None:
            raise self._lost
        self._boxes[box] = queue = asyncio.Queue[Frame](maxsize=BOX_FRAMES)
        try:
            await self._ws.send(message)
            yield
        finally:
            del self._boxes[box]
            while not queue.empty():  # frees the reader, if it waits to put a frame nobody will read
                queue.get_nowait()

    async def send_raw(self, message: str | bytes) -> Frame:
        """Send one frame as is and return the next frame no request in flight claims (for
        malformed-input tests)."""
        async with self._opened(RAW, message):
            return await self._next(RAW)

    async def stream(self, payload: Request) -> AsyncIterator[Frame]:
        """Send one message; yield its events as they come, then its reply (last)."""
        request_id = next(self._ids)
        async with self._opened(request_id, json.dumps({**payload, "id": request_id})):
            while True:
                frame = await self._next(request_id)
                yield frame
                if is_reply(frame):
                    return

    async def request(self, payload: Request) -> Frame:
        """Send one message and return its reply (events before it are passed over)."""
        request_id = next(self._ids)
        async with self._opened(request_id, json.dumps({**payload, "id": request_id})):
            while not is_reply(frame := await self._next(request_id)):
                pass
            return frame

    async def act(self, action: Mapping[str, Any], **envelope: Unpack[Envelope]) -> Frame:
        """A native action; raises :class:`ActionFailed` on an error reply."""
        return check_reply(await self.request(message(action, envelope)))

    async def screenshot(self, fmt: str = "png", **options: object) -> bytes:
        return image_bytes(await self.act({"type": "screenshot", "format": fmt, **options}))


class SandboxClient:
    """The blocking twin of :class:`AsyncSandboxClient`, safe to share between threads: whichever
    caller waits reads the next frame for all of them, and sorts it to its box. ``headers``: sent with
    the handshake (the CLI's API key, which never goes in an address)."""

    def __init__(
        self, ws_url: str, *, controller_secret: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        self._url = ws_url
        self._secret = controller_secret
        self._headers = headers
        self._ws: SyncConnection | None = None
        self._stack = contextlib.ExitStack()
        self._ids = itertools.count(1)
        self._boxes: dict[Box, deque[Frame]] = {}
        self._turn = threading.Condition()  # guards the boxes; one caller reads the socket at a time
        self._reading = False

    def __enter__(self) -> Self:
        options, signed = _dial(self._secret, self._headers)
        self._ws = self._stack.enter_context(sync_connect(self._url, **options))
        try:
            _check_proof(self._secret, signed, self._ws.response)
        except UnprovenController:
            with contextlib.suppress(ConnectionClosed, OSError):  # what answered need not close cleanly
                self._stack.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    def _next(self, box: Box) -> Frame:
        """The next frame of ``box``: taken if another caller read it already, else read here (frames
        for other boxes are filed on the way; one no box claims goes to a raw read, or is dropped)."""
        assert self._ws is not None, "use `with`"
        with self._turn:
            while not self._boxes[box]:
                if self._reading:
                    self._turn.wait()
                    continue
                self._reading = True
                self._turn.release()
                try:
                    frame: Frame = json.loads(self._ws.recv())
                finally:
                    self._turn.acquire()
                    self._reading = False
                    self._turn.notify_all()
                if not isinstance(frame, dict):
                    continue  # no reply nor event: nobody's
                target = self._boxes.get(frame.get("id"), self._boxes.get(RAW))
                if target is not None:
                    target.append(frame)
            return self._boxes[box].popleft()

    @contextlib.contextmanager
    def _opened(self, box: Box, message: str | bytes) -> Iterator[None]:
        assert self._ws is not None, "use `with`"
        with self._turn:
            self._boxes[box] = deque()
        try:
            self._ws.send(message)
            yield
        finally:
            with self._turn:
                del self._boxes[box]

    def send_raw(self, message: str | bytes) -> Frame:
        with self._opened(RAW, message):
            return self._next(RAW)

    def stream(self, payload: Request) -> Iterator[Frame]:
        """Send one message; yield its events as they come, then its reply (last)."""
        request_id = next(self._ids)
        with self._opened(request_id, json.dumps({**payload, "id": request_id})):
            while True:
                frame = self._next(request_id)
                yield frame
                if is_reply(frame):
                    return

    def request(self, payload: Request) -> Frame:
        request_id = next(self._ids)
        with self._opened(request_id, json.dumps({**payload, "id": request_id})):
            while not is_reply(frame := self._next(request_id)):
                pass
            return frame

    def act(self, action: Mapping[str, Any], **envelope: Unpack[Envelope]) -> Frame:
        return check_reply(self.request(message(action, envelope)))

    def screenshot(self, fmt: str = "png", **options: object) -> bytes:
        return image_bytes(self.act({"type": "screenshot", "format": fmt, **options}))
