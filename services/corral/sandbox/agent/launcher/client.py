"""The controller's side of the launcher: :class:`LauncherClient` (async), which implements
:class:`corral.sandbox.tools.agentfs.AgentFs` and spawns the agent's processes, and :class:`Control`,
the channel to one shepherd.

One connection, opened on first use and again after the launcher restarted; requests carry ids and
may overlap (the launcher answers them in turn).

A command's way holds no launcher: after each spawn the client reserves the next shepherd in the
background (the launcher's ``reserve``), and the next spawn sends its job and stdio straight to that
shepherd's child, forked and waiting. With no spare held (the first command, or two at once) or a
spare whose child died while it waited (the OOM killer's first pick), the launcher's ``spawn`` does it.

A failed operation raises ``OSError(errno, strerror, filename)`` as :mod:`os` would; a launcher that
cannot be reached raises ``ConnectionError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.sandbox.agent.launcher import messages as m
from corral.sandbox.agent.launcher.messages import SOCKET_PATH, SPARE_IDLE_S
from corral.sandbox.tools.agentfs import DirEntry, FileStat

log = logging.getLogger("corral.launcher.client")

# The next spare is reserved once the program exited, or this long after it started: not at once,
# when two more forks would take the CPU from the program that just began (two cores, it niced).
RESERVE_DELAY_S = 0.02
# Spares held: two, so that a command that follows another at once still finds one ready while the
# first one's successor is being forked (each is a shepherd and its child, copies of the launcher).
SPARES = 2
# How long a freeze waits for spawns already on their way to exec (their programs then are the agent's
# and the sweep stops them); past it, it sweeps anyway.
SPAWNS_SETTLE_S = 5.0


@dataclass(frozen=True, slots=True)
class SpawnRefused:
    """The program never ran: ``stage`` ("fork", "setup", "cwd" or "exec") failed with ``errno`` on
    ``path``."""

    stage: str
    errno: int
    path: str | None

    def error(self) -> OSError:
        return OSError(self.errno, os.strerror(self.errno), self.path)


class Control:
    """The controller's end of one shepherd's control channel: its events in order, and orders.
    ``on_exit`` is called once the main process exited (or the channel ended)."""

    def __init__(self, sock: socket.socket, on_exit: Callable[[], None] | None = None) -> None:
        self._sock = sock
        self._on_exit = on_exit
        sock.setblocking(False)
        self._events: asyncio.Queue[m.ShepherdEvent | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)
        self.closed = False

    def _readable(self) -> None:
        try:
            data = self._sock.recv(m.MAX_MESSAGE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._loop.remove_reader(self._sock.fileno())
            self._events.put_nowait(None)
            self._exited()
            return
        with contextlib.suppress(ValueError):  # a shepherd is the launcher's code: nothing else writes here
            event = m.parse_event(data)
            self._events.put_nowait(event)
            if event.kind in ("exited", "failed"):
                self._exited()

    def _exited(self) -> None:
        on_exit, self._on_exit = self._on_exit, None
        if on_exit is not None:
            on_exit()

    async def next_event(self) -> m.ShepherdEvent | None:
        """The shepherd's next event; None once it is gone (after ``empty``, or if it died)."""
        event = await self._events.get()
        if event is None:
            self._events.put_nowait(None)  # every later call sees the end too
        return event

    def signal(self, number: int) -> None:
        self._send(m.order("signal", number))

    def kill_tree(self) -> None:
        self._send(m.order("kill_tree"))

    def _send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self._sock.send(data)

    def close(self) -> None:
        """Closing makes the shepherd kill whatever is left of the tree."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


@dataclass(frozen=True, slots=True)
class Reserved:
    """A shepherd forked ahead for this controller: our end of its control channel, and of the job
    socket its child waits on. Dropping it (closing both) ends the shepherd and its child."""

    control: socket.socket
    job: socket.socket
    shepherd: int

    def close(self) -> None:
        self.job.close()
        self.control.close()


@dataclass(frozen=True, slots=True)
class Spawned:
    """A running program: its pid and its shepherd's channel (which now owns the events)."""

    pid: int
    control: Control


def _start_on(spare: Reserved, job: bytes, stdio: tuple[int, int, int], on_exit: Callable[[], None]) -> Control | None:
    """The job and its stdio straight to a reserved shepherd's child; None if that child died while it
    waited (then the caller goes to the launcher, the spare dropped)."""
    try:
        spare.job.setblocking(False)  # a fresh socket's buffer holds a whole job: never waits
        socket.send_fds(spare.job, [job], list(stdio))
    except OSError as exc:
        log.info("the spare shepherd's child is gone (%s): the launcher starts this one", exc)
        spare.control.close()
        return None
    finally:
        spare.job.close()
    return Control(spare.control, on_exit)


def _path(value: bytes | None) -> str | None:
    return None if value is None else os.fsdecode(value)


def _entry(obj: dict[str, Any]) -> DirEntry:
    path = os.fsdecode(m.unb64(obj["path"], "path"))
    target = obj.get("target")
    return DirEntry(
        name=os.path.basename(path),
        path=path,
        type=obj["type"],
        size=obj["size"],
        mode=obj["mode"],
        mtime=obj["mtime"],
        target=None if target is None else os.fsdecode(m.unb64(target, "target")),
    )


def _stat(obj: dict[str, Any]) -> FileStat:
    entry = _entry(obj)
    return FileStat(entry.name, entry.path, entry.type, entry.size, entry.mode, entry.mtime, entry.target)


class LauncherClient:
    """Asks the launcher, as the controller's uid, to act as the agent. Implements AgentFs."""

    def __init__(self, path: str | os.PathLike[str] = SOCKET_PATH) -> None:
        self._path = path
        self._sock: socket.socket | None = None
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], list[int]]]] = {}
        self._next_id = 0
        self._connecting = asyncio.Lock()
        self._spares: list[Reserved] = []
        self._reserving: asyncio.Task[None] | None = None
        self._letting_go: asyncio.TimerHandle | None = None
        self.spare_idle_s = SPARE_IDLE_S
        self._closed = False
        # Closed while the agent is frozen: a program started then would run unstopped. Spawns on
        # their way when a freeze begins are counted, and waited for (see freeze).
        self._may_spawn = asyncio.Event()
        self._may_spawn.set()
        self._spawning = 0
        self._spawned = asyncio.Condition()

    async def close(self) -> None:
        self._closed = True
        if self._letting_go is not None:
            self._letting_go.cancel()
        reserving, self._reserving = self._reserving, None
        if reserving is not None:
            reserving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reserving
        spares, self._spares = self._spares, []
        for spare in spares:
            spare.close()
        self._drop(ConnectionError("the launcher client closed"))

    # -- the connection ---------------------------------------------------------------------------------

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
                self._drop(ConnectionError(f"the launcher connection failed: {exc}"))
                return
            if not data:
                self._drop(ConnectionError("the launcher closed the connection"))
                return
            self._answer(data, fds)

    def _answer(self, data: bytes, fds: list[int]) -> None:
        try:
            reply = m.decode(data)
        except ValueError:
            reply = {}
        future = self._pending.pop(reply.get("id", -1), None)
        if future is None or future.done():
            for fd in fds:
                os.close(fd)
            return
        future.set_result((reply, fds))

    def _drop(self, error: Exception) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def _call(self, op: str, fds: list[int] | None = None, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        sock = await self._connected()
        self._next_id += 1
        request_id = self._next_id
        data = m.encode(m.request(op, request_id, **fields))
        future: asyncio.Future[tuple[dict[str, Any], list[int]]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._send(sock, data, fds or [])
        except OSError as exc:
            self._pending.pop(request_id, None)
            self._drop(ConnectionError(f"the launcher connection failed: {exc}"))
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
            code = int(reply.get("errno") or errno.EIO)
            path = reply.get("path")
            message = reply.get("message") or os.strerror(code)
            raise OSError(code, message, None if path is None else os.fsdecode(m.unb64(path, "path")))
        return reply, got

    @staticmethod
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

    # -- processes --------------------------------------------------------------------------------------

    async def openpty(self) -> tuple[int, int]:
        """A new terminal (master, slave), opened as the agent so its /dev/pts node is the agent's."""
        _, fds = await self._call("openpty")
        return fds[0], fds[1]

    async def spawn(
        self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], *, pty: bool = False
    ) -> Spawned | SpawnRefused:
        """Start ``argv`` as the agent with ``stdio`` (the caller keeps and closes its copies);
        returns once it runs (exec done) or could not. Raises OSError if no shepherd could start.
        While the agent is frozen it waits for the thaw."""
        await self._may_spawn.wait()
        self._spawning += 1
        try:
            return await self._spawn(argv, env, cwd, stdio, pty)
        finally:
            self._spawning -= 1
            async with self._spawned:
                self._spawned.notify_all()

    async def _spawn(
        self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], pty: bool
    ) -> Spawned | SpawnRefused:
        job = m.job({"argv": argv, "env": env, "cwd": cwd, "pty": pty})
        spare = await self._take_spare()
        control = _start_on(spare, job, stdio, self._reserve_next) if spare is not None else None
        if control is None:
            control = await self._spawn_by_launcher(argv, env, cwd, stdio, pty)
        try:
            first = await control.next_event()
        except BaseException:
            control.close()
            self._reserve_next()
            raise
        if first is not None and first.kind == "started" and first.pid is not None:
            asyncio.get_running_loop().call_later(RESERVE_DELAY_S, self._reserve_next)
            return Spawned(first.pid, control)
        self._reserve_next()
        control.close()
        if first is None or first.kind != "failed":
            raise OSError(errno.EIO, "the shepherd ended before it said how the start went")
        return SpawnRefused(first.stage or "setup", first.errno or errno.EIO, _path(first.path))

    async def _spawn_by_launcher(
        self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], pty: bool
    ) -> Control:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            await self._call("spawn", [*stdio, theirs.fileno()], argv=argv, env=env, cwd=cwd, pty=pty)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return Control(ours, self._reserve_next)

    async def reserve(self) -> Reserved:
        """A shepherd forked ahead for this controller (see :class:`Reserved`). Raises OSError."""
        reply, fds = await self._call("reserve")
        if len(fds) != m.RESERVE_FDS:
            for fd in fds:
                os.close(fd)
            raise OSError(errno.EIO, f"a reserve brings {m.RESERVE_FDS} descriptors, not {len(fds)}")
        return Reserved(socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1]), int(reply["shepherd"]))

    async def _take_spare(self) -> Reserved | None:
        """The spare held (waiting for one on its way rather than going to the launcher)."""
        reserving = self._reserving
        if not self._spares and reserving is not None:
            await asyncio.wait([reserving])  # never cancels it: the next command wants it too
        return self._spares.pop(0) if self._spares else None

    def _reserve_next(self) -> None:
        if self._closed or len(self._spares) >= SPARES or self._reserving is not None:
            return
        self._reserving = asyncio.get_running_loop().create_task(self._reserve_spare())

    async def _reserve_spare(self) -> None:
        try:
            spare = await self.reserve()
        except OSError as exc:
            log.info("no spare shepherd (%s): the next command goes through the launcher", exc)
            return
        finally:
            self._reserving = None
        if self._closed or len(self._spares) >= SPARES:
            spare.close()
            return
        self._spares.append(spare)
        if self._letting_go is not None:
            self._letting_go.cancel()
        self._letting_go = asyncio.get_running_loop().call_later(self.spare_idle_s, self._let_spares_go)
        self._reserve_next()  # until SPARES are held

    def _let_spares_go(self) -> None:
        """Idle: the spares held are closed (each shepherd and its child end), and a reservation on its
        way is cancelled (its answer's sockets are closed as they come); none is reserved again until
        the next command."""
        self._letting_go = None
        if self._reserving is not None:
            self._reserving.cancel()
        spares, self._spares = self._spares, []
        for spare in spares:
            spare.close()
        if spares:
            log.info("idle for %.0f s: %d spare shepherd(s) let go", self.spare_idle_s, len(spares))

    # -- a human's turn ---------------------------------------------------------------------------------

    async def freeze(self) -> dict[str, Any]:
        """Every process of the agent's uid stopped (the launcher's ``freeze``); no spawn until
        :meth:`thaw`. A spawn already past its start is let reach its exec first: before that its
        child is not yet the agent, and a sweep would miss it. Raises OSError (``ETIMEDOUT``: the
        processes did not all stop) or ConnectionError."""
        self._may_spawn.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SPAWNS_SETTLE_S), self._spawned:
                await self._spawned.wait_for(lambda: self._spawning == 0)
        reply, _ = await self._call("freeze")
        return {k: v for k, v in reply.items() if k not in ("id", "ok")}

    async def thaw(self) -> dict[str, Any]:
        """The agent's processes continued (but those it had stopped itself before the freeze), and
        spawns allowed again, even if the launcher could not be asked."""
        try:
            reply, _ = await self._call("thaw")
        finally:
            self._may_spawn.set()
        return {k: v for k, v in reply.items() if k not in ("id", "ok")}

    # -- AgentFs ----------------------------------------------------------------------------------------

    async def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        _, fds = await self._call("open", path=os.fsencode(path), flags=flags, mode=mode)
        return fds[0]

    async def stat(self, path: str, *, follow_symlinks: bool = True) -> FileStat:
        reply, _ = await self._call("stat", path=os.fsencode(path), follow_symlinks=follow_symlinks)
        return _stat(reply["stat"])

    async def scandir(self, path: str, limit: int) -> tuple[list[DirEntry], bool]:
        # One reply holds what fits a message; a big directory comes in several, each from where
        # the last one stopped (readdir's order holds while the directory does not change).
        entries: list[DirEntry] = []
        skip = 0
        while True:
            reply, _ = await self._call("scandir", path=os.fsencode(path), limit=limit - len(entries), skip=skip)
            entries += [_entry(entry) for entry in reply["entries"]]
            following = reply.get("next")
            if not isinstance(following, int) or len(entries) >= limit:
                return entries, bool(reply["truncated"]) or isinstance(following, int)
            skip = following

    async def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False) -> None:
        await self._call("mkdir", path=os.fsencode(path), mode=mode, parents=parents)

    async def mkstemp(self, directory: str, prefix: str) -> tuple[int, str]:
        reply, fds = await self._call("mkstemp", directory=os.fsencode(directory), prefix=os.fsencode(prefix))
        return fds[0], os.fsdecode(m.unb64(reply["path"], "path"))

    async def rename(self, source: str, destination: str, *, replace: bool = True) -> None:
        await self._call("rename", source=os.fsencode(source), destination=os.fsencode(destination), replace=replace)

    async def chmod(self, path: str, mode: int) -> None:
        await self._call("chmod", path=os.fsencode(path), mode=mode)

    async def unlink(self, path: str) -> None:
        await self._call("unlink", path=os.fsencode(path))

    async def rmdir(self, path: str) -> None:
        await self._call("rmdir", path=os.fsencode(path))

    async def rmtree(self, path: str) -> None:
        await self._call("rmtree", path=os.fsencode(path))
