"""The controller's one connection to the launcher: opened on first use and again after the launcher
restarted; requests carry ids and may overlap (the launcher answers them in turn).

A failed operation raises ``OSError(errno, strerror, filename)`` as :mod:`os` would; a launcher that
cannot be reached raises ``ConnectionError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket

from corral.sandbox.agent.launcher import messages as m

Answer = tuple[m.Reply, list[int]]  # a reply, and the descriptors that came with it (the caller's now)


class Connection:
    """Requests to the launcher at ``path`` and their replies."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = path
        self._sock: socket.socket | None = None
        self._pending: dict[int, asyncio.Future[Answer]] = {}
        self._next_id = 0
        self._connecting = asyncio.Lock()

    async def _connected(self) -> socket.socket:
        async with self._connecting:
            if self._sock is not None:
                return self._sock
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                sock.connect(str(self._path))
            except OSError as exc:
                sock.close()
                raise ConnectionError(f"the launcher does not answer at {self._path}: {exc}") from None
            sock.setblocking(False)
            asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)
            self._sock = sock
            return sock

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while True:
            try:
                # Close-on-exec: nothing the controller ever runs inherits a shepherd's socket.
                data, fds, _, _ = socket.recv_fds(sock, m.MAX_MESSAGE + 1, m.MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                return
            except OSError as exc:
                self.drop(ConnectionError(f"the launcher connection failed: {exc}"))
                return
            if not data:
                self.drop(ConnectionError("the launcher closed the connection"))
                return
            self._answer(data, fds)

    def _answer(self, data: bytes, fds: list[int]) -> None:
        try:
            reply = m.parse_reply(data)
        except ValueError:
            reply = {}
        request_id = reply.get("id", -1)
        future = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if future is None or future.done():
            for fd in fds:
                os.close(fd)
            return
        future.set_result((reply, fds))

    def drop(self, error: Exception) -> None:
        """The connection closed (the next call opens another); every request waiting gets ``error``."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def call(self, op: str, fds: list[int] | None = None, **fields: object) -> Answer:
        """``op`` with ``fields`` (and ``fds`` sent beside it), answered; raises OSError for a failure."""
        sock = await self._connected()
        self._next_id += 1
        request_id = self._next_id
        data = m.encode(m.request(op, request_id, **fields))
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await _send(sock, data, fds or [])
        except OSError as exc:
            self._pending.pop(request_id, None)
            self.drop(ConnectionError(f"the launcher connection failed: {exc}"))
            raise ConnectionError(f"could not reach the launcher: {exc}") from None
        try:
            reply, got = await future
        except asyncio.CancelledError:
            self._pending.pop(request_id, None)
            if future.done() and not future.cancelled() and future.exception() is None:
                # Answered, then cancelled before this task resumed: the descriptors that came
                # (a spare shepherd's sockets) would leak, and that shepherd wait for ever.
                for fd in future.result()[1]:
                    os.close(fd)
            raise
        if not reply.get("ok"):
            for fd in got:
                os.close(fd)
            raise _failure(reply)
        return reply, got


def _failure(reply: m.Reply) -> OSError:
    code = int(reply.get("errno") or errno.EIO)
    path = reply.get("path")
    message = reply.get("message") or os.strerror(code)
    return OSError(code, message, None if path is None else os.fsdecode(m.unb64(path, "path")))


async def _send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            socket.send_fds(sock, [data], fds) if fds else sock.send(data)
            return
        except BlockingIOError:
            writable: asyncio.Future[None] = loop.create_future()
            loop.add_writer(sock.fileno(), writable.set_result, None)
            try:
                await writable
            finally:
                loop.remove_writer(sock.fileno())
