"""The agent's processes, from the controller's side: :class:`ProcessTable` runs the command and
process actions (``exec``, ``process_*``) through the launcher, which starts each program as the
agent under a shepherd (:mod:`corral.sandbox.agent.launcher`).

The table owns what the controller holds of each process: the read ends of its stdout and stderr
(or a PTY's master), the write end of its stdin, the shepherd's control channel, a bounded ring per
stream (``process_output``) and, for a foreground ``exec``, the first ``max_output_bytes`` of each
stream. None of it touches the desktop: these actions run beside the others, never under
``Desktop.lock``.

A process stays in the table (``running``) until its whole tree is gone, then as finished until
:attr:`ProcessSettings.keep_finished` newer ones push it out; closing the table (the controller's
end) kills every tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import struct
import termios
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, assert_never

from corral.errors import ActionError, ErrorCode, os_error
from corral.protocol import actions as a
from corral.sandbox.agent import agentenv
from corral.sandbox.agent.launcher import Control, LauncherClient, Spawned, SpawnRefused
from corral.sandbox.agent.launcher import messages as lm
from corral.sandbox.agent.output import Budget, Capture, Encoding, Ring, RingPool, StreamDecoder, fit, json_size, render
from corral.sandbox.placeholders import Placeholders

log = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], Awaitable[None]]
"""Sends one event frame for the request being served (the caller adds the request's id)."""
Tap = Callable[[bytes], None]
"""Given every chunk a process prints, of any stream, in the order the chunks are read (the shell's reader)."""

READ_CHUNK = 64 * 1024
STREAM_HIGH_WATER = 1 << 20  # bytes queued for a slow streaming client before the pipes stop being read
# What a reply's output text may take as JSON, all streams together: a frame is at most 16 MiB
# (the gateway's limit) and escapes make a byte up to six (a control byte, a replaced one).
REPLY_TEXT_BYTES = 12 << 20
KILL_WAIT_S = 10.0  # a tree's kill takes milliseconds; past this the shepherd is stuck
# The sandbox's memory cgroup counts its OOM kills: cgroup v2's memory.events, v1's memory.oom_control.
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    """Defaults and caps of the process actions (from ControllerSettings)."""

    exec_timeout_ms: int = 60_000
    max_timeout_ms: int = 600_000
    output_bytes: int = 1 << 20
    max_output_bytes: int = 8 << 20
    buffer_bytes: int = 4 << 20
    # All the rings together, and all foreground execs' captures together: the agent's processes,
    # however many, cost the controller at most these (the sandbox's memory is the agent's too).
    buffers_total_bytes: int = 64 << 20
    captures_total_bytes: int = 64 << 20
    max_processes: int = 256
    keep_finished: int = 64
    proxy: str = ""  # the session's egress proxy (host:port), or empty
    ca_bundle: str | None = None


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a process action knows of its request: the action id (the egress audit's, and the
    proxy username its commands use) and how to stream events to the caller, if it can."""

    action_id: str
    emit: Emit | None = None


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


def _oom_kills() -> int | None:
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


@dataclass
class Output:
    """One stream of a process as the controller reads it."""

    name: a.Stream
    fd: int | None
    ring: Ring
    capture: Capture | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # its descriptor is closed (tests wait on it)


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
    stream: asyncio.Queue[tuple[str, bytes] | None] | None = None
    queued: int = 0
    paused: bool = False
    tap: Tap | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def running(self) -> bool:
        return not self.tree_done.is_set()

    def status(self) -> dict[str, Any]:
        """The result fields every process action shares (an exec's, without its output)."""
        end = self.ended if self.ended is not None else time.monotonic()
        return {
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": signal_name(self.signal),
            "oom_killed": self.oom_killed,
            "duration_ms": round((end - self.began) * 1000, 2),
        }

    def listing(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "command": self.command,
            "argv": self.argv,
            "cwd": self.cwd,
            "pty": self.pty,
            "background": self.background,
            "started": round(self.started, 3),
            "running": self.running,
            "exit_code": self.exit_code,
            "signal": signal_name(self.signal),
            "action_id": self.action_id,
        }


class ProcessTable:
    """The processes this controller started, and the actions on them."""

    def __init__(
        self, launcher: LauncherClient, settings: ProcessSettings, placeholders: Placeholders | None = None
    ) -> None:
        self._launcher = launcher
        self._settings = settings
        # The session's secret placeholders: each exec's environment gets those of the moment it starts.
        self._placeholders = Placeholders() if placeholders is None else placeholders
        self._processes: dict[int, Process] = {}
        self._rings = RingPool(settings.buffers_total_bytes)
        self._captures = Budget(settings.captures_total_bytes)
        self._starting = 0  # starts under way: they count against max_processes already

    @property
    def settings(self) -> ProcessSettings:
        return self._settings

    @property
    def launcher(self) -> LauncherClient:
        """The launcher's client, which is also the controller's :class:`corral.sandbox.tools.agentfs.AgentFs`."""
        return self._launcher

    async def close(self) -> None:
        """The controller's end: every tree is killed (each shepherd does it when its channel closes)."""
        for process in list(self._processes.values()):
            self._release(process, kill=True)
        await self._launcher.close()

    async def run(self, action: a.ProcessAction, context: RunContext) -> dict[str, Any]:
        match action:
            case a.Exec():
                return await self._exec(action, context)
            case a.ProcessList():
                return {"processes": [p.listing() for p in self._processes.values()]}
            case a.ProcessWait():
                return await self._wait(self._find(action.pid), action.timeout_ms)
            case a.ProcessKill():
                return self._kill(action.pid, _signal(action.signal))
            case a.ProcessWrite():
                return await self._write(self._find(action.pid), action.payload(), action.eof)
            case a.ProcessOutput():
                return self._output(self._find(action.pid), action)
            case a.ProcessResize():
                return self._resize(self._find(action.pid), action.rows, action.cols)
            case _:
                assert_never(action)

    # -- starting ---------------------------------------------------------------------------------------

    def _find(self, pid: int) -> Process:
        process = self._processes.get(pid)
        if process is None:
            raise ActionError(ErrorCode.NO_SUCH_PROCESS, f"no process {pid} was started here", field="action.pid")
        return process

    def _limits(self, action: a.Exec) -> tuple[int, int]:
        timeout = action.timeout_ms or self._settings.exec_timeout_ms
        if timeout > self._settings.max_timeout_ms:
            raise ActionError(
                ErrorCode.INVALID_FIELD, f"timeout_ms is at most {self._settings.max_timeout_ms}", "action.timeout_ms"
            )
        output = self._settings.output_bytes if action.max_output_bytes is None else action.max_output_bytes
        if output > self._settings.max_output_bytes:
            message = f"max_output_bytes is at most {self._settings.max_output_bytes}"
            raise ActionError(ErrorCode.INVALID_FIELD, message, "action.max_output_bytes")
        return timeout, output

    def command_environment(self, action_id: str) -> dict[str, str]:
        """What every command the action ``action_id`` starts is told (agentenv), with the session's
        placeholders of this moment."""
        settings = self._settings
        return agentenv.command_environment(settings.proxy, settings.ca_bundle, action_id, self._placeholders.by_name)

    def watch(self, pid: int, tap: Tap) -> Process:
        """The process ``pid``, whose output is now also handed to ``tap`` as it is read (the persistent
        shell reads its own process this way: corral.sandbox.agent.shell)."""
        process = self._find(pid)
        process.tap = tap
        return process

    def _environment(self, action: a.Exec, action_id: str) -> list[bytes]:
        env = self.command_environment(action_id)
        env["TERM"] = "xterm-256color" if action.pty else "dumb"
        env.update(action.env)
        return [f"{name}={value}".encode() for name, value in env.items()]

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        """A place among ``max_processes``, held from before the (awaited) start until the process
        is in the table: starts running side by side cannot pass the limit together."""
        running = sum(1 for p in self._processes.values() if p.running) + self._starting
        if running >= self._settings.max_processes:
            raise ActionError(
                ErrorCode.PROCESS_LIMIT, f"{running} processes are running; at most {self._settings.max_processes}"
            )
        self._starting += 1
        try:
            yield
        finally:
            self._starting -= 1

    def _check_size(self, action: a.Exec, action_id: str) -> None:
        """What the launcher's one message must hold (base64 and JSON grow it, the session's
        environment adds to it), checked here so the agent hears which field is too big."""
        argv = [os.fsencode(arg) for arg in action.program()]
        env = self._environment(action, action_id)
        size = len(json.dumps(lm.request("spawn", 0, argv=argv, env=env, cwd=os.fsencode(action.cwd), pty=False)))
        if size <= lm.MAX_MESSAGE:
            return
        env_size = sum(len(f"{name}={value}".encode()) for name, value in action.env.items())
        field_name = "action.env" if env_size > sum(map(len, argv)) else _program_field(action)
        message = f"the command, its env and cwd take {size} bytes in the launcher's message; at most {lm.MAX_MESSAGE}"
        raise ActionError(ErrorCode.INVALID_FIELD, f"{message} (pass data through stdin or a file)", field_name)

    async def _start(
        self, action: a.Exec, action_id: str, capture: int | None, *, stdin_socket: bool = False
    ) -> Process:
        ours, theirs = await self._stdio(action, stdin_socket=stdin_socket)
        try:
            spawned = await self._launcher.spawn(
                [os.fsencode(arg) for arg in action.program()],
                self._environment(action, action_id),
                os.fsencode(action.cwd),
                theirs,
                pty=action.pty is not None,
            )
        except BaseException as exc:
            _close_all(ours)
            if isinstance(exc, ConnectionError):
                raise ActionError(ErrorCode.EXEC_FAILED, f"commands cannot run: {exc}") from None
            if isinstance(exc, OSError):
                raise _start_error(exc) from None
            raise
        finally:
            _close_all(set(theirs))
        if isinstance(spawned, SpawnRefused):
            _close_all(ours)
            raise _refusal(spawned, action)
        return self._track(spawned, action, action_id, ours, capture)

    async def _stdio(self, action: a.Exec, *, stdin_socket: bool = False) -> tuple[list[int], tuple[int, int, int]]:
        """(the controller's ends: stdin, stdout, stderr or [master]; the child's: stdin, stdout, stderr)."""
        if action.pty is not None:
            try:
                master, slave = await self._launcher.openpty()
            except ConnectionError as exc:
                raise ActionError(ErrorCode.EXEC_FAILED, f"commands cannot run: {exc}") from None
            except OSError as exc:
                raise os_error(exc, what="opening a terminal") from None
            _set_size(master, action.pty.rows, action.pty.cols)
            os.set_blocking(master, False)
            return [master], (slave, slave, slave)
        out_r, out_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        err_r, err_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        os.set_blocking(out_w, True)
        os.set_blocking(err_w, True)
        if stdin_socket:
            pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec, as Python makes them
            in_w, in_r = (end.detach() for end in pair)
            os.set_blocking(in_w, False)
        elif action.background or action.stdin_bytes() is not None:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(in_w, False)
        else:
            in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
        ours = [in_w, out_r, err_r] if in_w >= 0 else [out_r, err_r]
        return ours, (in_r, out_w, err_w)

    def _track(self, spawned: Spawned, action: a.Exec, action_id: str, ours: list[int], capture: int | None) -> Process:
        size = self._settings.buffer_bytes
        if action.pty is not None:
            (master,) = ours
            stdin: int | None = master
            outputs = {"stdout": Output("stdout", master, self._rings.ring(size))}
        else:
            stdin = ours[0] if len(ours) == 3 else None
            out_r, err_r = ours[-2:]
            outputs = {
                "stdout": Output("stdout", out_r, self._rings.ring(size)),
                "stderr": Output("stderr", err_r, self._rings.ring(size)),
            }
        if capture is not None:
            for output in outputs.values():
                output.capture = Capture(capture, self._captures)
        process = Process(
            pid=spawned.pid,
            argv=action.program(),
            command=action.command,
            cwd=action.cwd,
            pty=action.pty is not None,
            background=action.background,
            action_id=action_id,
            control=spawned.control,
            outputs=outputs,
            stdin=stdin,
            oom_before=_oom_kills(),
        )
        self._forget_finished()
        self._processes[process.pid] = process
        loop = asyncio.get_running_loop()
        for output in outputs.values():
            if output.fd is not None:
                loop.add_reader(output.fd, self._readable, process, output)
        self._keep(process, self._follow(process))
        return process

    def _keep(self, process: Process, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        process.tasks.add(task)
        task.add_done_callback(process.tasks.discard)
        return task

    def _forget_finished(self) -> None:
        finished = [p for p in self._processes.values() if not p.running]
        for process in finished[: max(0, len(finished) - self._settings.keep_finished + 1)]:
            self._release(process, kill=False)
            for output in process.outputs.values():
                self._rings.release(output.ring)
            del self._processes[process.pid]

    # -- what the shepherd and the pipes say ------------------------------------------------------------

    async def _follow(self, process: Process) -> None:
        """The shepherd's events, until it is gone."""
        while (event := await process.control.next_event()) is not None:
            if event.kind == "exited":
                self._main_exited(process, event.exit_code, event.signal)
                if not event.running:
                    process.tree_done.set()
            elif event.kind == "empty":
                break
        if not process.main_done.is_set():
            log.warning("the shepherd of %d ended without its exit status", process.pid)
            self._main_exited(process, None, None)
        process.tree_done.set()
        process.control.close()
        for output in process.outputs.values():
            output.ring.finished = True  # what the pool gives up first when the budget is spent

    def _main_exited(self, process: Process, exit_code: int | None, number: int | None) -> None:
        process.ended = time.monotonic()
        process.exit_code, process.signal = exit_code, number
        if number == signal.SIGKILL and not process.killed:
            now = _oom_kills()
            if now is not None and process.oom_before is not None:
                process.oom_killed = now > process.oom_before
        elif number is None and exit_code is not None:
            process.oom_killed = False
        process.main_done.set()

    def _readable(self, process: Process, output: Output) -> None:
        if output.fd is None:
            return
        try:
            chunk = os.read(output.fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO: a PTY whose last slave closed
            chunk = b""
        if not chunk:
            if process.pty and not process.main_done.is_set():
                # Every slave closed, but the program may still run: a program closes its stdio before it
                # exits (cat does), and closing the master now hangs the terminal up, so it would die of
                # SIGHUP. Stop reading; close once it exited, as a terminal emulator does.
                asyncio.get_running_loop().remove_reader(output.fd)
                self._keep(process, self._close_after_exit(process, output))
                return
            if process.pty and process.stdin == output.fd:
                process.stdin = None  # one descriptor, the terminal's master: closed below for both
            self._close_output(output)
            return
        output.ring.append(chunk)
        if output.capture is not None:
            output.capture.add(chunk)
        if process.tap is not None:
            process.tap(chunk)
        if process.stream is not None:
            process.stream.put_nowait((output.name, chunk))
            process.queued += len(chunk)
            if process.queued > STREAM_HIGH_WATER and not process.paused:
                process.paused = True
                self._pause(process, True)

    async def _close_after_exit(self, process: Process, output: Output) -> None:
        await process.main_done.wait()
        if process.stdin == output.fd:
            process.stdin = None  # one descriptor, the terminal's master: closed for both
        self._close_output(output)

    def _pause(self, process: Process, paused: bool) -> None:
        loop = asyncio.get_running_loop()
        for output in process.outputs.values():
            if output.fd is None:
                continue
            if paused:
                loop.remove_reader(output.fd)
            else:
                loop.add_reader(output.fd, self._readable, process, output)

    def drain(self, process: Process) -> None:
        """Read what the pipes hold now (after the main process exited: all it wrote is there)."""
        for output in process.outputs.values():
            while output.fd is not None:
                before = output.ring.end
                self._readable(process, output)
                if output.ring.end == before:
                    break

    @staticmethod
    def _close_output(output: Output) -> None:
        if output.fd is None:
            return
        fd, output.fd = output.fd, None
        with contextlib.suppress(ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        output.closed.set()

    def _release(self, process: Process, *, kill: bool) -> None:
        if kill and process.running:
            process.killed = True
        process.control.close()  # a shepherd whose channel closes kills what is left
        shared = {o.fd for o in process.outputs.values()}
        for output in process.outputs.values():
            self._close_output(output)
            if output.capture is not None:  # a foreground exec whose caller went away
                output.capture.release()
                output.capture = None
        if process.stdin is not None and process.stdin not in shared:
            with contextlib.suppress(OSError):
                os.close(process.stdin)
        process.stdin = None
        for task in list(process.tasks):
            task.cancel()

    # -- the actions ------------------------------------------------------------------------------------

    async def start_private(self, action: a.Exec, context: RunContext) -> dict[str, Any]:
        """A background ``action`` whose stdin is one end of a socket pair, not a pipe: no other process
        can reopen it through /proc/<pid>/fd/0 (opening a socket by path fails, ENXIO), so what is
        written to it reaches the program alone (the persistent shell's scripts)."""
        assert action.background and action.pty is None and action.stdin_bytes() is None
        return await self._exec(action, context, stdin_socket=True)

    async def _exec(self, action: a.Exec, context: RunContext, *, stdin_socket: bool = False) -> dict[str, Any]:
        timeout_ms, output_bytes = self._limits(action)
        self._check_size(action, context.action_id)
        with self._slot():
            capture = None if action.background else output_bytes
            process = await self._start(action, context.action_id, capture, stdin_socket=stdin_socket)
        stdin = action.stdin_bytes()
        if stdin is not None:
            self._keep(process, self._feed(process, stdin, eof=not action.background))
        if action.background:
            return {"pid": process.pid, "background": True}
        pump = None
        if action.stream and context.emit is not None:
            process.stream = asyncio.Queue()
            pump = self._keep(process, self._pump(process, context.emit, action.output_encoding))
        try:
            timed_out = await self._until_exit(process, timeout_ms)
        except BaseException:
            # The caller went away (the connection closed): a foreground command goes with it.
            process.killed = True
            process.control.kill_tree()
            raise
        self.drain(process)
        if pump is not None and process.stream is not None:
            process.stream.put_nowait(None)
            await pump
        process.stream = None
        return self._result(process, timed_out, action.output_encoding)

    async def _until_exit(self, process: Process, timeout_ms: int) -> bool:
        """Wait for the main process; at the timeout kill the whole tree. True if it timed out."""
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await process.main_done.wait()
            return False
        except TimeoutError:
            pass
        process.killed = True
        process.control.kill_tree()
        try:
            async with asyncio.timeout(KILL_WAIT_S):
                await process.tree_done.wait()
        except TimeoutError:
            # Still the timeout's answer (with what was printed); the tree stays listed as running.
            log.warning("the tree of %d was not gone %.0f s after its kill", process.pid, KILL_WAIT_S)
        return True

    def _result(self, process: Process, timed_out: bool, encoding: Encoding) -> dict[str, Any]:
        out: dict[str, Any] = process.status()
        captured: dict[str, Capture] = {}
        for name in ("stdout", "stderr"):
            output = process.outputs.get(name)
            if output is not None and output.capture is not None:
                captured[name], output.capture = output.capture, None
        out |= _fit_streams(captured, encoding)
        for capture in captured.values():
            capture.release()
        out["timed_out"] = timed_out
        out["encoding"] = encoding
        return out

    async def _pump(self, process: Process, emit: Emit, encoding: Encoding) -> None:
        """Output events, in the order the chunks were read, until the exec's reply is due."""
        queue = process.stream
        assert queue is not None
        decoders = {name: StreamDecoder(encoding) for name in process.outputs}
        while (item := await queue.get()) is not None:
            name, chunk = item
            process.queued -= len(chunk)
            if process.paused and process.queued < STREAM_HIGH_WATER // 2:
                process.paused = False
                self._pause(process, False)
            text = decoders[name].feed(chunk)
            if text:
                await emit({"event": "output", "stream": name, "data": text, "encoding": encoding})
        for name, decoder in decoders.items():
            if rest := decoder.feed(b"", final=True):
                await emit({"event": "output", "stream": name, "data": rest, "encoding": encoding})
        if process.paused:
            process.paused = False
            self._pause(process, False)

    async def _wait(self, process: Process, timeout_ms: int) -> dict[str, Any]:
        timed_out = False
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await process.main_done.wait()
        except TimeoutError:
            timed_out = True
        return {**process.status(), "timed_out": timed_out, "running": process.running}

    def _kill(self, pid: int, number: int) -> dict[str, Any]:
        process = self._find(pid)
        if process.running:
            if number == signal.SIGKILL:
                process.killed = True
                process.control.kill_tree()
            else:
                process.control.signal(number)
        return {"pid": process.pid, "signal": signal_name(number)}

    async def _feed(self, process: Process, data: bytes, eof: bool) -> None:
        """An exec's ``stdin``, written beside its run (the program may print before it reads it all)."""
        with contextlib.suppress(ActionError, OSError):  # it exited without reading everything
            await self._write(process, data, eof)

    async def _write(self, process: Process, data: bytes, eof: bool) -> dict[str, Any]:
        async with process.writing:  # in turn, the end of file after what was asked before it
            return await self._write_now(process, data, eof)

    async def _write_now(self, process: Process, data: bytes, eof: bool) -> dict[str, Any]:
        fd = process.stdin
        if fd is None:
            message = "the process has no stdin open (a foreground exec without stdin, or after eof)"
            raise ActionError(ErrorCode.INVALID_REQUEST, message, "action.pid")
        try:
            await _write_all(fd, data)
        except BrokenPipeError:
            raise ActionError(ErrorCode.INVALID_REQUEST, "the process closed its stdin", "action.pid") from None
        if eof:
            if process.pty:
                await _write_all(fd, b"\x04")  # the terminal's end of file (its master stays: it is the output too)
            else:
                process.stdin = None
                os.close(fd)
        return {"pid": process.pid, "written": len(data)}

    def _output(self, process: Process, action: a.ProcessOutput) -> dict[str, Any]:
        output = process.outputs.get(action.stream)
        if output is None:
            raise ActionError(
                ErrorCode.INVALID_FIELD, "a PTY process has only stdout (the terminal)", field="action.stream"
            )
        found = output.ring.read(action.offset, action.max_bytes)
        data, used = fit(found.data, action.output_encoding, REPLY_TEXT_BYTES)  # the rest: from next_offset
        return {
            "pid": process.pid,
            "stream": action.stream,
            "data": data,
            "encoding": action.output_encoding,
            "offset": found.offset,
            "next_offset": found.offset + used,
            "dropped": found.dropped,
            "running": process.running,
            "exit_code": process.exit_code,
        }

    def _resize(self, process: Process, rows: int, cols: int) -> dict[str, Any]:
        if not process.pty or process.stdin is None:
            raise ActionError(ErrorCode.INVALID_REQUEST, f"process {process.pid} has no terminal", "action.pid")
        _set_size(process.stdin, rows, cols)  # the kernel tells the foreground group (SIGWINCH)
        return {"pid": process.pid, "rows": rows, "cols": cols}


def _fit_streams(captured: dict[str, Capture], encoding: Encoding) -> dict[str, Any]:
    """``stdout``/``stderr`` and their ``*_truncated`` flags, the two texts cut to fit one reply
    together: each gets half of :data:`REPLY_TEXT_BYTES`, and what the other leaves unused."""
    out: dict[str, Any] = {}
    sizes = {name: json_size(render(bytes(c.data), encoding)) for name, c in captured.items()}
    for name in ("stdout", "stderr"):
        capture = captured.get(name)
        if capture is None:
            out[name], out[f"{name}_truncated"] = "", False
            continue
        others = sum(size for other, size in sizes.items() if other != name)
        text, used = fit(bytes(capture.data), encoding, REPLY_TEXT_BYTES - min(others, REPLY_TEXT_BYTES // 2))
        out[name], out[f"{name}_truncated"] = text, capture.truncated or used < len(capture.data)
    return out


def _start_error(exc: OSError) -> ActionError:
    """No shepherd or no process: the sandbox's process limit, or another failure to start."""
    if exc.errno in (errno.EAGAIN, errno.ENOMEM):
        return ActionError(ErrorCode.PROCESS_LIMIT, f"no room for another process: {exc.strerror}")
    return ActionError(ErrorCode.EXEC_FAILED, f"the command could not be started: {exc.strerror or exc}")


def _signal(value: str | int) -> int:
    try:
        return signal_number(value)
    except (KeyError, ValueError):
        raise ActionError(ErrorCode.INVALID_FIELD, f"no signal {value!r}", "action.signal") from None


def _refusal(refused: SpawnRefused, action: a.Exec) -> ActionError:
    """A program that never ran, as the action's failure, blamed on the field that caused it."""
    if refused.stage == "cwd":
        return os_error(refused.error(), field="action.cwd", what=f"cwd {action.cwd!r}")
    program = action.program()[0]
    field_name = _program_field(action)
    if refused.stage == "exec" and refused.errno == errno.ENOENT:
        return ActionError(ErrorCode.PROGRAM_NOT_FOUND, f"{program!r}: no such program on PATH", field_name)
    if refused.stage == "exec" and refused.errno == errno.EACCES:
        return ActionError(ErrorCode.PERMISSION_DENIED, f"{program!r}: permission denied", field_name)
    reason = os.strerror(refused.errno)
    if refused.errno == errno.EAGAIN:
        return ActionError(ErrorCode.PROCESS_LIMIT, f"could not start {program!r}: {reason}")
    return ActionError(ErrorCode.EXEC_FAILED, f"could not start {program!r} ({refused.stage}): {reason}", field_name)


def _program_field(action: a.Exec) -> str:
    return "action.argv" if action.argv is not None else "action.command"


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _close_all(fds: list[int] | set[int]) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


async def _write_all(fd: int, data: bytes) -> None:
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
