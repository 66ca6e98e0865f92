"""``sb.processes``: commands that run in the background, in each twin."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from corral import commands
from corral.commands import ExecResult
from corral.protocol.results import ProcessInfo, ProcessOutputSlice, Resized, Signalled
from corral.sdk.messages import messages

if TYPE_CHECKING:
    from corral.sdk.connection import AsyncConnected, Connected


class Processes:
    """``sb.processes``: commands that run in the background, their input, output and end."""

    def __init__(self, sandbox: Connected) -> None:
        self._sandbox = sandbox

    def start(
        self,
        command: str | Sequence[str] | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        pty: tuple[int, int] | None = None,
    ) -> int:
        """Start a command in the background; its pid (``pty``: rows and columns of a terminal)."""
        action = commands.exec_action(command, argv, cwd=cwd, env=env, stdin=stdin, pty=pty)
        return self._sandbox._send(messages.start(action))

    def list(self) -> builtins.list[ProcessInfo]:
        return self._sandbox._send(messages.process_list())

    def wait(self, pid: int, *, timeout_ms: int | None = None) -> ExecResult:
        """How it ended; ``running`` (and ``timed_out``) when the wait ran out first (it is not killed)."""
        return self._sandbox._send(messages.process_wait(pid, timeout_ms))

    def kill(self, pid: int, signal: str | int = "SIGKILL") -> Signalled:
        """SIGKILL ends its whole tree; another signal goes to its process group."""
        return self._sandbox._send(messages.process_kill(pid, signal))

    def write(self, pid: int, data: str | bytes, *, eof: bool = False) -> int:
        """Write to its stdin (``eof``: then close it); how many bytes were written."""
        return self._sandbox._send(messages.process_write(pid, data, eof))

    def output(
        self,
        pid: int,
        *,
        stream: str = "stdout",
        offset: int = 0,
        max_bytes: int | None = None,
        output_encoding: str | None = None,
    ) -> ProcessOutputSlice:
        """What it printed from ``offset`` on (``next_offset`` to go on from, ``dropped`` if the buffer lost some)."""
        return self._sandbox._send(messages.process_output(pid, stream, offset, max_bytes, output_encoding))

    def resize(self, pid: int, rows: int, cols: int) -> Resized:
        return self._sandbox._send(messages.process_resize(pid, rows, cols))


class AsyncProcesses:
    """The async twin of :class:`Processes`."""

    def __init__(self, sandbox: AsyncConnected) -> None:
        self._sandbox = sandbox

    async def start(
        self,
        command: str | Sequence[str] | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        pty: tuple[int, int] | None = None,
    ) -> int:
        action = commands.exec_action(command, argv, cwd=cwd, env=env, stdin=stdin, pty=pty)
        return await self._sandbox._send(messages.start(action))

    async def list(self) -> builtins.list[ProcessInfo]:
        return await self._sandbox._send(messages.process_list())

    async def wait(self, pid: int, *, timeout_ms: int | None = None) -> ExecResult:
        return await self._sandbox._send(messages.process_wait(pid, timeout_ms))

    async def kill(self, pid: int, signal: str | int = "SIGKILL") -> Signalled:
        return await self._sandbox._send(messages.process_kill(pid, signal))

    async def write(self, pid: int, data: str | bytes, *, eof: bool = False) -> int:
        return await self._sandbox._send(messages.process_write(pid, data, eof))

    async def output(
        self,
        pid: int,
        *,
        stream: str = "stdout",
        offset: int = 0,
        max_bytes: int | None = None,
        output_encoding: str | None = None,
    ) -> ProcessOutputSlice:
        return await self._sandbox._send(messages.process_output(pid, stream, offset, max_bytes, output_encoding))

    async def resize(self, pid: int, rows: int, cols: int) -> Resized:
        return await self._sandbox._send(messages.process_resize(pid, rows, cols))
