"""The controller's side of the launcher: :class:`LauncherClient` (async), which implements
:class:`corral.sandbox.tools.agentfs.AgentFs` (:class:`~corral.sandbox.agent.launcher.files.LauncherFiles`)
and spawns the agent's processes, each watched through its shepherd's
:class:`~corral.sandbox.agent.launcher.control.Control`.

Its parts: the connection and its requests (:mod:`~corral.sandbox.agent.launcher.connection`),
the shepherds reserved ahead (:mod:`~corral.sandbox.agent.launcher.spares`), the file operations
(:mod:`~corral.sandbox.agent.launcher.files`); here the spawning, and the freeze and thaw of a
person's turn.

A failed operation raises ``OSError(errno, strerror, filename)`` as :mod:`os` would; a launcher that
cannot be reached raises ``ConnectionError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from typing import TypedDict

from corral.sandbox.agent.launcher import messages as m
from corral.sandbox.agent.launcher.connection import Connection
from corral.sandbox.agent.launcher.control import Control, Spawned, SpawnRefused
from corral.sandbox.agent.launcher.files import LauncherFiles
from corral.sandbox.agent.launcher.messages import SOCKET_PATH
from corral.sandbox.agent.launcher.spares import Reserved, Spares, start_on

__all__ = ["Control", "Frozen", "LauncherClient", "Reserved", "SpawnRefused", "Spawned", "Thawed"]

# The next spare is reserved once the program exited, or this long after it started: not at once,
# when two more forks would take the CPU from the program that just began (two cores, it niced).
RESERVE_DELAY_S = 0.02
# How long a freeze waits for spawns already on their way to exec (their programs then are the agent's
# and the sweep stops them); past it, it sweeps anyway.
SPAWNS_SETTLE_S = 5.0


class Frozen(TypedDict):
    """A freeze, done: every agent process stopped, in ``rounds`` scans, ``processes`` of them."""

    done: bool
    rounds: int
    processes: int


class Thawed(TypedDict):
    """A thaw: how many processes were continued, and how many left stopped (the agent's own doing)."""

    continued: int
    left_stopped: int


def _path(value: bytes | None) -> str | None:
    return None if value is None else os.fsdecode(value)


class LauncherClient(LauncherFiles):
    """Asks the launcher, as the controller's uid, to act as the agent. Implements AgentFs."""

    def __init__(self, path: str | os.PathLike[str] = SOCKET_PATH) -> None:
        self._launcher = Connection(path)
        super().__init__(self._launcher)
        self.spares = Spares(self.reserve)
        # Closed while the agent is frozen: a program started then would run unstopped. Spawns on
        # their way when a freeze begins are counted, and waited for (see freeze).
        self._may_spawn = asyncio.Event()
        self._may_spawn.set()
        self._spawning = 0
        self._spawned = asyncio.Condition()

    @property
    def spare_idle_s(self) -> float:
        """How long a spare is held without a command (the launcher's own spares wait as long)."""
        return self.spares.idle_s

    @spare_idle_s.setter
    def spare_idle_s(self, seconds: float) -> None:
        self.spares.idle_s = seconds

    async def close(self) -> None:
        await self.spares.close()
        self._launcher.drop(ConnectionError("the launcher client closed"))

    # -- processes --------------------------------------------------------------------------------------

    async def openpty(self) -> tuple[int, int]:
        """A new terminal (master, slave), opened as the agent so its /dev/pts node is the agent's."""
        _, fds = await self._launcher.call("openpty")
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
        spare = await self.spares.take()
        control = start_on(spare, job, stdio, self.spares.reserve_next) if spare is not None else None
        if control is None:
            control = await self._spawn_by_launcher(argv, env, cwd, stdio, pty)
        try:
            first = await control.next_event()
        except BaseException:
            control.close()
            self.spares.reserve_next()
            raise
        if first is not None and first.kind == "started" and first.pid is not None:
            asyncio.get_running_loop().call_later(RESERVE_DELAY_S, self.spares.reserve_next)
            return Spawned(first.pid, control)
        self.spares.reserve_next()
        control.close()
        if first is None or first.kind != "failed":
            raise OSError(errno.EIO, "the shepherd ended before it said how the start went")
        return SpawnRefused(first.stage or "setup", first.errno or errno.EIO, _path(first.path))

    async def _spawn_by_launcher(
        self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], pty: bool
    ) -> Control:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            await self._launcher.call("spawn", [*stdio, theirs.fileno()], argv=argv, env=env, cwd=cwd, pty=pty)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return Control(ours, self.spares.reserve_next)

    async def reserve(self) -> Reserved:
        """A shepherd forked ahead for this controller (see :class:`Reserved`). Raises OSError."""
        reply, fds = await self._launcher.call("reserve")
        if len(fds) != m.RESERVE_FDS:
            for fd in fds:
                os.close(fd)
            raise OSError(errno.EIO, f"a reserve brings {m.RESERVE_FDS} descriptors, not {len(fds)}")
        return Reserved(socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1]), int(reply["shepherd"]))

    # -- a human's turn ---------------------------------------------------------------------------------

    async def freeze(self) -> Frozen:
        """Every process of the agent's uid stopped (the launcher's ``freeze``); no spawn until
        :meth:`thaw`. A spawn already past its start is let reach its exec first: before that its
        child is not yet the agent, and a sweep would miss it. Raises OSError (``ETIMEDOUT``: the
        processes did not all stop) or ConnectionError."""
        self._may_spawn.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SPAWNS_SETTLE_S), self._spawned:
                await self._spawned.wait_for(lambda: self._spawning == 0)
        reply, _ = await self._launcher.call("freeze")
        return Frozen(done=reply["done"], rounds=reply["rounds"], processes=reply["processes"])

    async def thaw(self) -> Thawed:
        """The agent's processes continued (but those it had stopped itself before the freeze), and
        spawns allowed again, even if the launcher could not be asked."""
        try:
            reply, _ = await self._launcher.call("thaw")
        finally:
            self._may_spawn.set()
        return Thawed(continued=reply["continued"], left_stopped=reply["left_stopped"])
