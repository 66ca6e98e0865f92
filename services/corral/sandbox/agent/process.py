"""One agent process as the controller holds it (:class:`Process`): its streams, its stdin, its
shepherd's channel, and what the process actions ask of one process (wait, signal, write, read back,
resize), answered as :mod:`corral.protocol.results` models. The table that starts and keeps them is
:class:`corral.sandbox.agent.processes.ProcessTable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import struct
import termios
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.agent.launcher import Control
from corral.sandbox.agent.output import Capture, Ring, fit

log = logging.getLogger(__name__)

Tap = Callable[[str, bytes], None]  # the stream's name ("stdout", "stderr") and what it read
"""Given every chunk a process prints, of any stream, in the order the chunks are read (the shell's reader)."""

READ_CHUNK = 64 * 1024
STREAM_HIGH_WATER = 1 << 20  # bytes queued for a slow streaming client before the pipes stop being read
# What a reply's output text may take as JSON, all streams together: a frame is at most 16 MiB
# (the gateway's limit) and escapes make a byte up to six (a control byte, a replaced one).
REPLY_TEXT_BYTES = 12 << 20
KILL_WAIT_S = 10.0  # a tree's kill takes milliseconds; past this the shepherd is stuck
# The sandbox's memory cgroup counts its OOM kills: cgroup v2's memory.events, v1's memory.oom_control.
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def signal_number(value: str | int) -> int:
    """``"SIGTERM"``, ``"TERM"`` or ``15`` to 15; raises ValueError for a name or number that is none."""
    if isinstance(value, int):
        return signal.Signals(value).value
    name = value.upper()
    return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"].value


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def oom_kills() -> int | None:
    """How many processes the OOM killer ended in this sandbox so far; None where no counter is kept."""
    for path in OOM_COUNTERS:
        try:
            with open(path, encoding="ascii") as counters:
                for line in counters:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@dataclass
class Output:
    """One stream of a process as the controller reads it."""

    name: a.Stream
    fd: int | None
    ring: Ring
    capture: Capture | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # its descriptor is closed (tests wait on it)

    def close(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        with contextlib.suppress(ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        self.closed.set()


@dataclass
class Process:
    pid: int
    argv: list[str]
    command: str | None
    cwd: str
    pty: bool
    background: bool
    action_id: str
    control: Control
    outputs: dict[str, Output]
    stdin: int | None  # the write end (or the PTY's master); None once closed
    # One write at a time: two waiting on one descriptor would replace each other's wake-up.
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: float = field(default_factory=time.time)
    began: float = field(default_factory=time.monotonic)
    ended: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    killed: bool = False  # by us (timeout, process_kill, the table's end)
    oom_before: int | None = None
    oom_killed: bool | None = None
    main_done: asyncio.Event = field(default_factory=asyncio.Event)
    tree_done: asyncio.Event = field(default_factory=asyncio.Event)
    stream: asyncio.Queue[tuple[a.Stream, bytes] | None] | None = None
    queued: int = 0
    paused: bool = False
    tap: Tap | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def running(self) -> bool:
        return not self.tree_done.is_set()

    def duration_ms(self) -> float:
        end = self.ended if self.ended is not None else time.monotonic()
        return round((end - self.began) * 1000, 2)

    def listing(self) -> r.ProcessInfo:
        return r.ProcessInfo(
            pid=self.pid,
            command=self.command,
            argv=self.argv,
            cwd=self.cwd,
            pty=self.pty,
            background=self.background,
            started=round(self.started, 3),
            running=self.running,
            exit_code=self.exit_code,
            signal=signal_name(self.signal),
            action_id=self.action_id,
        )

    def keep(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """``work`` as a task of this process's, cancelled when it is released."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def watch_outputs(self) -> None:
        """Read each stream as it becomes readable, and follow the shepherd's events."""
        loop = asyncio.get_running_loop()
        for output in self.outputs.values():
            if output.fd is not None:
                loop.add_reader(output.fd, self.readable, output)
        self.keep(self._follow())

    # -- what the shepherd and the pipes say ------------------------------------------------------------

    async def _follow(self) -> None:
        """The shepherd's events, until it is gone."""
        while (event := await self.control.next_event()) is not None:
            if event.kind == "exited":
                self._main_exited(event.exit_code, event.signal)
                if not event.running:
                    self.tree_done.set()
            elif event.kind == "empty":
                break
        if not self.main_done.is_set():
            log.warning("the shepherd of %d ended without its exit status", self.pid)
            self._main_exited(None, None)
        self.tree_done.set()
        self.control.close()
        for output in self.outputs.values():
            output.ring.finished = True  # what the pool gives up first when the budget is spent

    def _main_exited(self, exit_code: int | None, number: int | None) -> None:
        self.ended = time.monotonic()
        self.exit_code, self.signal = exit_code, number
        if number == signal.SIGKILL and not self.killed:
            now = oom_kills()
            if now is not None and self.oom_before is not None:
                self.oom_killed = now > self.oom_before
        elif number is None and exit_code is not None:
            self.oom_killed = False
        self.main_done.set()

    def readable(self, output: Output) -> None:
        if output.fd is None:
            return
        try:
            chunk = os.read(output.fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO: a PTY whose last slave closed
            chunk = b""
        if not chunk:
            if self.pty and not self.main_done.is_set():
                # Every slave closed, but the program may still run: a program closes its stdio before it
                # exits (cat does), and closing the master now hangs the terminal up, so it would die of
                # SIGHUP. Stop reading; close once it exited, as a terminal emulator does.
                asyncio.get_running_loop().remove_reader(output.fd)
                self.keep(self._close_after_exit(output))
                return
            if self.pty and self.stdin == output.fd:
                self.stdin = None  # one descriptor, the terminal's master: closed below for both
            output.close()
            return
        self._took(output, chunk)

    def _took(self, output: Output, chunk: bytes) -> None:
        output.ring.append(chunk)
        if output.capture is not None:
            output.capture.add(chunk)
        if self.tap is not None:
            self.tap(output.name, chunk)
        if self.stream is not None:
            self.stream.put_nowait((output.name, chunk))
            self.queued += len(chunk)
            if self.queued > STREAM_HIGH_WATER and not self.paused:
                self.pause(True)

    async def _close_after_exit(self, output: Output) -> None:
        await self.main_done.wait()
        if self.stdin == output.fd:
            self.stdin = None  # one descriptor, the terminal's master: closed for both
        output.close()

    def pause(self, paused: bool) -> None:
        """Stop (or go on) reading the pipes: a streaming client is behind."""
        self.paused = paused
        loop = asyncio.get_running_loop()
        for output in self.outputs.values():
            if output.fd is None:
                continue
            if paused:
                loop.remove_reader(output.fd)
            else:
                loop.add_reader(output.fd, self.readable, output)

    def drain(self) -> None:
        """Read what the pipes hold now (after the main process exited: all it wrote is there)."""
        for output in self.outputs.values():
            while output.fd is not None:
                before = output.ring.end
                self.readable(output)
                if output.ring.end == before:
                    break

    def release(self, *, kill: bool) -> None:
        if kill and self.running:
            self.killed = True
        self.control.close()  # a shepherd whose channel closes kills what is left
        shared = {o.fd for o in self.outputs.values()}
        for output in self.outputs.values():
            output.close()
            if output.capture is not None:  # a foreground exec whose caller went away
                output.capture.release()
                output.capture = None
        if self.stdin is not None and self.stdin not in shared:
            with contextlib.suppress(OSError):
                os.close(self.stdin)
        self.stdin = None
        for task in list(self.tasks):
            task.cancel()

    # -- the actions on one process ---------------------------------------------------------------------

    def kill_tree(self) -> None:
        self.killed = True
        self.control.kill_tree()

    async def until_exit(self, timeout_ms: int) -> bool:
        """Wait for the main process; at the timeout kill the whole tree. True if it timed out."""
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self.main_done.wait()
            return False
        except TimeoutError:
            pass
        self.kill_tree()
        try:
            async with asyncio.timeout(KILL_WAIT_S):
                await self.tree_done.wait()
        except TimeoutError:
            # Still the timeout's answer (with what was printed); the tree stays listed as running.
            log.warning("the tree of %d was not gone %.0f s after its kill", self.pid, KILL_WAIT_S)
        return True

    async def wait(self, timeout_ms: int) -> r.ProcessWaited:
        timed_out = False
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self.main_done.wait()
        except TimeoutError:
            timed_out = True
        return r.ProcessWaited(
            pid=self.pid,
            exit_code=self.exit_code,
            signal=signal_name(self.signal),
            oom_killed=self.oom_killed,
            duration_ms=self.duration_ms(),
            timed_out=timed_out,
            running=self.running,
        )

    def kill(self, number: int) -> r.Signalled:
        if self.running:
            if number == signal.SIGKILL:
                self.kill_tree()
            else:
                self.control.signal(number)
        return r.Signalled(pid=self.pid, signal=signal_name(number) or str(number))

    async def write(self, data: bytes, eof: bool) -> r.StdinWritten:
        async with self.writing:  # in turn, the end of file after what was asked before it
            return await self._write_now(data, eof)

    async def _write_now(self, data: bytes, eof: bool) -> r.StdinWritten:
        fd = self.stdin
        if fd is None:
            message = "the process has no stdin open (a foreground exec without stdin, or after eof)"
            raise ActionError(ErrorCode.INVALID_REQUEST, message, "action.pid")
        try:
            await write_all(fd, data)
        except BrokenPipeError:
            raise ActionError(ErrorCode.INVALID_REQUEST, "the process closed its stdin", "action.pid") from None
        if eof:
            if self.pty:
                await write_all(fd, b"\x04")  # the terminal's end of file (its master stays: it is the output too)
            else:
                self.stdin = None
                os.close(fd)
        return r.StdinWritten(pid=self.pid, written=len(data))

    def output(self, action: a.ProcessOutput) -> r.ProcessOutputSlice:
        output = self.outputs.get(action.stream)
        if output is None:
            raise ActionError(
                ErrorCode.INVALID_FIELD, "a PTY process has only stdout (the terminal)", field="action.stream"
            )
        found = output.ring.read(action.offset, action.max_bytes)
        data, used = fit(found.data, action.output_encoding, REPLY_TEXT_BYTES)  # the rest: from next_offset
        return r.ProcessOutputSlice(
            pid=self.pid,
            stream=action.stream,
            data=data,
            encoding=action.output_encoding,
            offset=found.offset,
            next_offset=found.offset + used,
            dropped=found.dropped,
            running=self.running,
            exit_code=self.exit_code,
        )

    def resize(self, rows: int, cols: int) -> r.Resized:
        if not self.pty or self.stdin is None:
            raise ActionError(ErrorCode.INVALID_REQUEST, f"process {self.pid} has no terminal", "action.pid")
        set_size(self.stdin, rows, cols)  # the kernel tells the foreground group (SIGWINCH)
        return r.Resized(pid=self.pid, rows=rows, cols=cols)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def write_all(fd: int, data: bytes) -> None:
    """Everything into a non-blocking pipe or terminal, waiting for room as the reader makes it."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _settle, ready)
            try:
                await ready
            finally:
                loop.remove_writer(fd)
