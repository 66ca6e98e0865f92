"""The agent's processes, from the controller's side: :class:`ProcessTable` runs the command and
process actions (``exec``, ``process_*``) through the launcher, which starts each program as the
agent under a shepherd (:mod:`corral.sandbox.agent.launcher`).

The table keeps each :class:`~corral.sandbox.agent.process.Process` (its streams, stdin and
shepherd; :mod:`corral.sandbox.agent.process`), started by its
:class:`~corral.sandbox.agent.spawn.Spawner`, with a bounded ring per stream (``process_output``)
and, for a foreground ``exec``, the first ``max_output_bytes`` of each stream. None of it touches
the desktop: these actions run beside the others, never under ``Desktop.lock``.

A process stays in the table (``running``) until its whole tree is gone, then as finished until
:attr:`ProcessSettings.keep_finished` newer ones push it out; closing the table (the controller's
end) kills every tree.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import assert_never

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.agent.launcher import LauncherClient
from corral.sandbox.agent.output import Budget, Capture, Encoding, RingPool, StreamDecoder, fit, json_size, render
from corral.sandbox.agent.process import (
    KILL_WAIT_S,
    REPLY_TEXT_BYTES,
    STREAM_HIGH_WATER,
    Process,
    Tap,
    signal_name,
    signal_number,
)
from corral.sandbox.agent.spawn import ProcessSettings, Spawner
from corral.sandbox.placeholders import Placeholders
from corral.sandbox.sessionenv import SessionEnv

__all__ = [
    "KILL_WAIT_S",
    "REPLY_TEXT_BYTES",
    "Emit",
    "Process",
    "ProcessResult",
    "ProcessSettings",
    "ProcessTable",
    "RunContext",
    "signal_name",
    "signal_number",
]

Emit = Callable[[r.OutputEvent | r.CodeResultEvent], Awaitable[None]]
"""Sends one event frame for the request being served (the caller adds the request's id): an
exec's or a cell's printed chunk, a cell's displayed result (corral.sandbox.kernels)."""

ProcessResult = (
    r.ExecResult | r.ProcessListing | r.ProcessWaited | r.Signalled | r.StdinWritten | r.ProcessOutputSlice | r.Resized
)


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a process action knows of its request: the action id (the egress audit's, and the
    proxy username its commands use) and how to stream events to the caller, if it can."""

    action_id: str
    emit: Emit | None = None


class ProcessTable:
    """The processes this controller started, and the actions on them."""

    def __init__(
        self,
        launcher: LauncherClient,
        settings: ProcessSettings,
        placeholders: Placeholders | None = None,
        session_env: SessionEnv | None = None,
    ) -> None:
        self._launcher = launcher
        self._settings = settings
        self._processes: dict[int, Process] = {}
        self._rings = RingPool(settings.buffers_total_bytes)
        self._captures = Budget(settings.captures_total_bytes)
        placeholders = Placeholders() if placeholders is None else placeholders
        self._spawner = Spawner(launcher, settings, placeholders, self._rings, self._captures, session_env)
        self._starting = 0  # starts under way: they count against max_processes already

    @property
    def settings(self) -> ProcessSettings:
        return self._settings

    @property
    def launcher(self) -> LauncherClient:
        """The launcher's client, which is also the controller's :class:`corral.sandbox.tools.agentfs.AgentFs`."""
        return self._launcher

    @property
    def buffered_bytes(self) -> int:
        """What the processes' ring buffers hold now, all together (at most ``buffers_total_bytes``)."""
        return self._rings.held

    @property
    def captured_bytes(self) -> int:
        """What the running foreground execs' captures hold now, all together."""
        return self._captures.held

    def processes(self) -> list[Process]:
        """The processes in the table, running or kept as finished, oldest first."""
        return list(self._processes.values())

    async def close(self) -> None:
        """The controller's end: every tree is killed (each shepherd does it when its channel closes)."""
        for process in list(self._processes.values()):
            process.release(kill=True)
        await self._launcher.close()

    async def run(self, action: a.ProcessAction, context: RunContext) -> ProcessResult:
        match action:
            case a.Exec():
                return await self.exec(action, context)
            case a.ProcessList():
                return r.ProcessListing(processes=[p.listing() for p in self._processes.values()])
            case a.ProcessWait():
                return await self.find(action.pid).wait(action.timeout_ms)
            case a.ProcessKill():
                return self.kill(action.pid, action.signal)
            case a.ProcessWrite():
                return await self.find(action.pid).write(action.payload(), action.eof)
            case a.ProcessOutput():
                return self.find(action.pid).output(action)
            case a.ProcessResize():
                return self.find(action.pid).resize(action.rows, action.cols)
            case _:
                assert_never(action)

    def find(self, pid: int) -> Process:
        """The process ``pid`` of this table's; ``no_such_process`` (blamed on ``action.pid``) if none."""
        process = self._processes.get(pid)
        if process is None:
            raise ActionError(ErrorCode.NO_SUCH_PROCESS, f"no process {pid} was started here", field="action.pid")
        return process

    def kill(self, pid: int, value: str | int = "SIGKILL") -> r.Signalled:
        """SIGKILL ends the whole tree; another signal goes to the process's group."""
        try:
            number = signal_number(value)
        except (KeyError, ValueError):
            raise ActionError(ErrorCode.INVALID_FIELD, f"no signal {value!r}", "action.signal") from None
        return self.find(pid).kill(number)

    def command_environment(self, action_id: str) -> dict[str, str]:
        """What every command the action ``action_id`` starts is told (agentenv), with the session's
        placeholders of this moment."""
        return self._spawner.command_environment(action_id)

    def watch(self, pid: int, tap: Tap) -> Process:
        """The process ``pid``, whose output is now also handed to ``tap`` as it is read (the persistent
        shell reads its own process this way: corral.sandbox.agent.shell)."""
        process = self.find(pid)
        process.tap = tap
        return process

    # -- starting ---------------------------------------------------------------------------------------

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

    async def _start(self, action: a.Exec, action_id: str, capture: int | None, *, stdin_socket: bool) -> Process:
        with self._slot():
            process = await self._spawner.start(action, action_id, capture, stdin_socket=stdin_socket)
        self._forget_finished()
        self._processes[process.pid] = process
        process.watch_outputs()
        return process

    def _forget_finished(self) -> None:
        finished = [p for p in self._processes.values() if not p.running]
        for process in finished[: max(0, len(finished) - self._settings.keep_finished + 1)]:
            process.release(kill=False)
            for output in process.outputs.values():
                self._rings.release(output.ring)
            del self._processes[process.pid]

    # -- exec -------------------------------------------------------------------------------------------

    async def start_private(self, action: a.Exec, context: RunContext) -> r.ExecStarted:
        """A background ``action`` whose stdin is one end of a socket pair, not a pipe: no other process
        can reopen it through /proc/<pid>/fd/0 (opening a socket by path fails, ENXIO), so what is
        written to it reaches the program alone (the persistent shell's scripts)."""
        assert action.background and action.pty is None and action.stdin_bytes() is None
        started = (await self.exec(action, context, stdin_socket=True)).root
        assert isinstance(started, r.ExecStarted)
        return started

    async def exec(self, action: a.Exec, context: RunContext, *, stdin_socket: bool = False) -> r.ExecResult:
        timeout_ms, output_bytes = self._spawner.limits(action)
        self._spawner.check_size(action, context.action_id)
        capture = None if action.background else output_bytes
        process = await self._start(action, context.action_id, capture, stdin_socket=stdin_socket)
        stdin = action.stdin_bytes()
        if stdin is not None:
            process.keep(_feed(process, stdin, eof=not action.background))
        if action.background:
            return r.ExecResult(r.ExecStarted(pid=process.pid, background=True))
        pump = None
        if action.stream and context.emit is not None:
            process.stream = asyncio.Queue()
            pump = process.keep(_pump(process, context.emit, action.output_encoding))
        try:
            timed_out = await process.until_exit(timeout_ms)
        except BaseException:
            # The caller went away (the connection closed): a foreground command goes with it.
            process.kill_tree()
            raise
        process.drain()
        if pump is not None and process.stream is not None:
            process.stream.put_nowait(None)
            await pump
        process.stream = None
        return r.ExecResult(_finished(process, timed_out, action.output_encoding))


def _finished(process: Process, timed_out: bool, encoding: Encoding) -> r.ExecFinished:
    """A foreground exec's result; its captures' bytes go back to the budget."""
    captured: dict[str, Capture] = {}
    for name in ("stdout", "stderr"):
        output = process.outputs.get(name)
        if output is not None and output.capture is not None:
            captured[name], output.capture = output.capture, None
    (stdout, stdout_truncated), (stderr, stderr_truncated) = _fit_streams(captured, encoding)
    for capture in captured.values():
        capture.release()
    return r.ExecFinished(
        pid=process.pid,
        exit_code=process.exit_code,
        signal=signal_name(process.signal),
        oom_killed=process.oom_killed,
        duration_ms=process.duration_ms(),
        stdout=stdout,
        stdout_truncated=stdout_truncated,
        stderr=stderr,
        stderr_truncated=stderr_truncated,
        timed_out=timed_out,
        encoding=encoding,
    )


def _fit_streams(captured: dict[str, Capture], encoding: Encoding) -> list[tuple[str, bool]]:
    """(text, truncated) of ``stdout`` and ``stderr``, the two texts cut to fit one reply together:
    each gets half of :data:`REPLY_TEXT_BYTES`, and what the other leaves unused."""
    out: list[tuple[str, bool]] = []
    sizes = {name: json_size(render(bytes(c.data), encoding)) for name, c in captured.items()}
    for name in ("stdout", "stderr"):
        capture = captured.get(name)
        if capture is None:
            out.append(("", False))
            continue
        others = sum(size for other, size in sizes.items() if other != name)
        text, used = fit(bytes(capture.data), encoding, REPLY_TEXT_BYTES - min(others, REPLY_TEXT_BYTES // 2))
        out.append((text, capture.truncated or used < len(capture.data)))
    return out


async def _pump(process: Process, emit: Emit, encoding: Encoding) -> None:
    """Output events, in the order the chunks were read, until the exec's reply is due."""
    queue = process.stream
    assert queue is not None
    decoders = {name: StreamDecoder(encoding) for name in process.outputs}
    while (item := await queue.get()) is not None:
        name, chunk = item
        process.queued -= len(chunk)
        if process.paused and process.queued < STREAM_HIGH_WATER // 2:
            process.pause(False)
        text = decoders[name].feed(chunk)
        if text:
            await emit(r.OutputEvent(stream=name, data=text, encoding=encoding))
    for output in process.outputs.values():
        if rest := decoders[output.name].feed(b"", final=True):
            await emit(r.OutputEvent(stream=output.name, data=rest, encoding=encoding))
    if process.paused:
        process.pause(False)


async def _feed(process: Process, data: bytes, eof: bool) -> None:
    """An exec's ``stdin``, written beside its run (the program may print before it reads it all)."""
    with contextlib.suppress(ActionError, OSError):  # it exited without reading everything
        await process.write(data, eof)
