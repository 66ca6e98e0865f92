"""The client's spares, against a fake launcher on a real socket: a spawn with a reserved shepherd
held sends its job and stdio straight to that shepherd's child (no launcher on the way); with none
held, or one whose child died, the launcher's ``spawn`` does it; a client that closes drops its spare."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.sandbox.agent.launcher import messages as m
from corral.sandbox.agent.launcher.client import LauncherClient, Spawned

ARGV, ENV, CWD = [b"true", b"\xff"], [b"A=1"], b"/workspace"


class FakeLauncher:
    """Answers ``spawn`` (the shepherd says started, pid 1) and ``reserve`` (its child, once the job
    comes, says started, pid 2, or is already gone when ``child_dies``) from a thread."""

    def __init__(self, path: Path, *, child_dies: bool = False) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.child_dies = child_dies
        self.ops: list[str] = []
        self.jobs: list[tuple[dict[str, Any], int]] = []  # (fields, how many descriptors came)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        # A client that closed while an answer was on its way: gone, as the real launcher sees it.
        with conn, contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while True:
                data, fds, _, _ = socket.recv_fds(conn, m.MAX_MESSAGE + 1, m.MAX_FDS)
                if not data:
                    return
                request = m.parse_request(data, fds)
                self.ops.append(request.op)
                if request.op == "spawn":
                    *stdio, control = request.fds
                    for fd in stdio:
                        os.close(fd)
                    with socket.socket(fileno=control) as sock:
                        sock.send(m.event("started", pid=1))
                        sock.send(m.event("exited", exit_code=0, signal=None, running=False))
                    conn.send(m.encode(m.ok(request.id, shepherd=10)))
                else:
                    self._reserve(conn, request.id)

    def _reserve(self, conn: socket.socket, request_id: int) -> None:
        control, control_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        job, job_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.held.append(control_theirs)  # before the answer: the test looks at it once answered
        with job_theirs:
            if self.child_dies:
                job_theirs.close()
            with control, job:
                socket.send_fds(conn, [m.encode(m.ok(request_id, shepherd=20))], [control.fileno(), job.fileno()])
            if self.child_dies:
                return
            data, stdio, _, _ = socket.recv_fds(job_theirs, m.MAX_MESSAGE + 1, m.JOB_FDS)
        if not data:
            return  # the client dropped this spare
        self.jobs.append((m.parse_job(data), len(stdio)))
        for fd in stdio:
            os.close(fd)
        control_theirs.send(m.event("started", pid=2))

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=5)
        for sock in self.held:
            sock.close()


class ClientTimers:
    """The client's own timers (its reserve delay, its spares' idle wait) held instead of scheduled on
    the loop, so the test says when time passes; every other timer is the loop's as usual."""

    def __init__(self, client: LauncherClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client, self._loop, self._real = client, loop, loop.call_later
        self._now = 0.0
        self.held: list[tuple[float, asyncio.TimerHandle, Callable[..., object], tuple[object, ...]]] = []
        self._changed = asyncio.Event()

    def call_later(
        self, delay: float, callback: Callable[..., object], *args: object, **kw: Any
    ) -> asyncio.TimerHandle:
        if getattr(callback, "__self__", None) is not self._client:
            return self._real(delay, callback, *args, **kw)
        handle = asyncio.TimerHandle(self._loop.time() + delay, callback, args, self._loop)
        self.held.append((self._now + delay, handle, callback, args))
        self._changed.set()
        return handle

    async def until_one_waits(self, delay: float) -> None:
        """Until a timer of ``delay`` is held and not cancelled."""
        while not any(due - self._now == delay and not handle.cancelled() for due, handle, _, _ in self.held):
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), 10)

    def advance(self, seconds: float) -> None:
        """``seconds`` pass: the timers due by then run, in their order."""
        self._now += seconds
        due = sorted((t for t in self.held if t[0] <= self._now), key=lambda t: t[0])
        self.held = [t for t in self.held if t[0] > self._now]
        for _, handle, callback, args in due:
            if not handle.cancelled():
                callback(*args)


@pytest.fixture
def stdio() -> Iterator[tuple[int, int, int]]:
    fds = (os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY))
    yield fds
    for fd in fds:
        os.close(fd)


async def spawn_and_finish(client: LauncherClient, stdio: tuple[int, int, int]) -> Spawned:
    """A spawn whose program exited (which reserves the next spare)."""
    spawned = await client.spawn(ARGV, ENV, CWD, stdio)
    assert isinstance(spawned, Spawned)
    while (event := await spawned.control.next_event()) is not None and event.kind != "exited":
        pass
    return spawned


async def test_the_next_spawn_goes_straight_to_the_reserved_child(tmp_path: Path, stdio: tuple[int, int, int]) -> None:
    fake = FakeLauncher(tmp_path / "sock")
    client = LauncherClient(tmp_path / "sock")
    try:
        first = await spawn_and_finish(client, stdio)
        second = await client.spawn(ARGV, ENV, CWD, stdio)
        assert isinstance(second, Spawned)
        assert (first.pid, second.pid) == (1, 2)
        assert fake.ops.count("spawn") == 1  # the second spawn asked the launcher nothing
        assert fake.jobs == [({"argv": ARGV, "env": ENV, "cwd": CWD, "pty": False}, 3)]
        first.control.close()
        second.control.close()
    finally:
        await client.close()
        fake.close()


async def test_a_spare_whose_child_died_falls_back_to_the_launcher(tmp_path: Path, stdio: tuple[int, int, int]) -> None:
    fake = FakeLauncher(tmp_path / "sock", child_dies=True)
    client = LauncherClient(tmp_path / "sock")
    try:
        first = await spawn_and_finish(client, stdio)
        second = await client.spawn(ARGV, ENV, CWD, stdio)
        assert isinstance(second, Spawned) and second.pid == 1
        assert fake.ops.count("spawn") == 2 and "reserve" in fake.ops
        assert fake.jobs == []
        first.control.close()
        second.control.close()
    finally:
        await client.close()
        fake.close()


async def test_closing_the_client_drops_its_spare(tmp_path: Path, stdio: tuple[int, int, int]) -> None:
    fake = FakeLauncher(tmp_path / "sock", child_dies=True)
    client = LauncherClient(tmp_path / "sock")
    spare = await client.reserve()
    assert spare.shepherd == 20
    client._spares.append(spare)
    await client.close()
    assert spare.control.fileno() == spare.job.fileno() == -1
    assert fake.held[0].recv(16) == b""  # the shepherd's end sees the controller gone
    fake.close()


async def test_idle_spares_are_let_go_and_the_next_spawn_asks_the_launcher(
    tmp_path: Path, stdio: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeLauncher(tmp_path / "sock")
    client = LauncherClient(tmp_path / "sock")
    client.spare_idle_s = 0.3
    timers = ClientTimers(client, asyncio.get_running_loop())
    monkeypatch.setattr(asyncio.get_running_loop(), "call_later", timers.call_later)
    try:
        first = await spawn_and_finish(client, stdio)
        # The first spare reserved, its idle wait begun (the fake holds the second's answer until then).
        await timers.until_one_waits(client.spare_idle_s)
        assert len(client._spares) == 1
        spare = client._spares[0]
        timers.advance(0.29)
        assert client._spares == [spare]  # not idle long enough yet
        reserving = client._reserving  # the second spare, on its way
        assert reserving is not None
        timers.advance(0.01)
        await asyncio.wait_for(asyncio.gather(reserving, return_exceptions=True), 10)  # cancelled by the let-go
        assert reserving.cancelled()
        assert client._spares == [] and client._reserving is None
        assert spare.control.fileno() == spare.job.fileno() == -1
        assert fake.held[0].recv(16) == b""  # the shepherd's end sees its spare dropped
        second = await client.spawn(ARGV, ENV, CWD, stdio)
        assert isinstance(second, Spawned) and second.pid == 1  # through the launcher: no spare held
        assert fake.ops.count("spawn") == 2 and fake.jobs == []
        first.control.close()
        second.control.close()
    finally:
        await client.close()
        fake.close()
