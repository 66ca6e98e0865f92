"""The controller's end of one kernel's channels, over ZeroMQ on loopback: the shell (requests and
their replies) and IOPub (what the kernel publishes: output, displays, status). pyzmq is imported
here only, and this module only when the first kernel starts, so a session that never runs code
never loads it.

Bounded against a hostile kernel: each part at most :data:`wire.MAX_MESSAGE_BYTES` (ZeroMQ drops a
peer that sends more), at most :data:`wire.MAX_PARTS` parts kept, at most :data:`QUEUE_MESSAGES`
messages queued per socket; what fails its signature or shape is dropped and logged. Nobody reads
IOPub between cells, so whatever the kernel publishes then (a thread printing on after its cell)
waits in ZeroMQ's queue in the controller's memory: that queue is kept short, and past it the
kernel's own sending side holds or drops (its memory, not the controller's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from corral.errors import BadKernelMessage, KernelGone
from corral.sandbox.kernels import wire
from corral.sandbox.kernels.ports import Ports
from corral.sandbox.kernels.wire import Message

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger(__name__)

# Each socket's receive high-water mark, in messages, held by ZeroMQ in the controller's memory: each
# up to MAX_MESSAGE_BYTES a part, so 8 is up to 192 MiB of single-part messages (10,000 was 240 GB,
# an OOM kill of the controller by a thread printing between cells). The controller reads IOPub
# continuously while a cell runs: a short queue costs a flood's surplus only, cut anyway.
QUEUE_MESSAGES = 8
READY_POLL_S = 0.2  # how often a starting kernel is asked kernel_info until IOPub is seen to work


_CONTEXT: list[zmq.asyncio.Context] = []


def _context() -> zmq.asyncio.Context:
    if not _CONTEXT:
        _CONTEXT.append(zmq.asyncio.Context())
    return _CONTEXT[0]


class KernelLink:
    """One kernel's shell and IOPub sockets (:class:`corral.sandbox.kernels.cell.Link`)."""

    def __init__(self, ports: Ports, key: bytes, exited: asyncio.Event, interrupt: Callable[[], object]) -> None:
        self._key = key
        self._ports = ports
        self._session = wire.new_key().decode()[:32]
        self._exited = exited
        self._interrupt = interrupt
        self._shell = self._socket(zmq.DEALER, ports.shell)
        self._iopub = self._socket(zmq.SUB, ports.iopub)
        self._iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self._reads: dict[str, asyncio.Task[list[bytes]]] = {}
        self._exit_wait: asyncio.Task[bool] | None = None

    def _socket(self, kind: int, port: int) -> zmq.asyncio.Socket:
        sock = _context().socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.RCVHWM, QUEUE_MESSAGES)
        sock.connect(f"tcp://127.0.0.1:{port}")
        return sock

    async def execute(self, code: str) -> str:
        content: Mapping[str, object] = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        return await self.request("execute_request", content)

    async def request(self, msg_type: str, content: Mapping[str, object]) -> str:
        msg_id, frames = wire.request(self._key, self._session, msg_type, content)
        await self._shell.send_multipart(frames)
        return msg_id

    def interrupt(self) -> None:
        self._interrupt()

    async def next(self) -> Message:
        while True:
            for name, sock in (("shell", self._shell), ("iopub", self._iopub)):
                if name not in self._reads:
                    self._reads[name] = asyncio.ensure_future(_read(sock))
            if self._exit_wait is None:
                self._exit_wait = asyncio.ensure_future(self._exited.wait())
            await asyncio.wait([*self._reads.values(), self._exit_wait], return_when=asyncio.FIRST_COMPLETED)
            for name, task in list(self._reads.items()):
                if task.done():
                    del self._reads[name]
                    try:
                        return wire.parse(self._key, task.result())
                    except BadKernelMessage as exc:
                        log.warning("a message from a kernel was dropped: %s", exc)
            if self._exit_wait.done():
                raise KernelGone("the kernel's process ended")

    async def rejoin(self, timeout_s: float) -> None:
        """A new IOPub socket in place of one whose connection was dropped (a message over the frame
        cap: ZeroMQ does not reconnect after that), joined again as at the start."""
        read = self._reads.pop("iopub", None)
        if read is not None:
            read.cancel()
        self._iopub.close(linger=0)
        self._iopub = self._socket(zmq.SUB, self._ports.iopub)
        self._iopub.setsockopt(zmq.SUBSCRIBE, b"")
        await self.ready(timeout_s)

    async def ready(self, timeout_s: float) -> None:
        """Until the kernel answers kernel_info on the shell and IOPub is seen to deliver (a SUB
        socket misses what was published before it joined): TimeoutError or KernelGone otherwise."""
        async with asyncio.timeout(timeout_s):
            replied = published = False
            while not (replied and published):
                await self.request("kernel_info_request", {})
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(READY_POLL_S):
                        while not (replied and published):
                            message = await self.next()
                            replied = replied or message.msg_type == "kernel_info_reply"
                            published = published or message.msg_type == "status"

    def close(self) -> None:
        for task in [*self._reads.values(), *([self._exit_wait] if self._exit_wait else [])]:
            task.cancel()
        self._reads.clear()
        self._shell.close(linger=0)
        self._iopub.close(linger=0)


async def _read(sock: zmq.asyncio.Socket) -> list[bytes]:
    """One message's parts, at most :data:`wire.MAX_PARTS` + 1 kept (parse refuses more)."""
    parts: list[bytes] = [await sock.recv()]
    while sock.getsockopt(zmq.RCVMORE):
        part = await sock.recv()
        if len(parts) <= wire.MAX_PARTS:
            parts.append(part)
    return parts
