"""Commands, processes and files, a part of each twin (:class:`Execs`, :class:`AsyncExecs`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral import commands
from corral.commands import ExecResult
from corral.sdk.connection import AsyncConnected, Connected, waiting
from corral.sdk.files import AsyncFiles, Files
from corral.sdk.messages import messages
from corral.sdk.processes import AsyncProcesses, Processes
from corral.sdk.streams import AsyncExecStream, ExecStream


class Execs(Connected):
    """Commands, processes and files (docs/protocol.md): ``exec`` answers an :class:`ExecResult`."""

    def exec(
        self,
        command: str | Sequence[str] | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = None,
        output_encoding: str | None = None,
    ) -> ExecResult:
        """Run ``command`` (a string, by ``bash -lc``; a list, as argv with no shell) or ``argv`` as the
        agent and wait for it to end; a non-zero exit is a result (``.check()`` raises on it), a timeout
        kills its whole tree (``timed_out``)."""
        action = commands.exec_action(
            command,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            output_encoding=output_encoding,
        )
        return self._send(messages.exec(action))

    def exec_stream(
        self,
        command: str | Sequence[str] | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = 0,
        output_encoding: str | None = None,
    ) -> ExecStream:
        """:meth:`exec`, its output given as it comes: iterate for :class:`OutputChunk`, then the result.
        ``max_output_bytes`` defaults to 0, as ``corral exec`` does: the chunks carry every byte, so the
        final result does not repeat them (give a size to have the result hold the output too)."""
        action = commands.exec_action(
            command,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            output_encoding=output_encoding,
            stream=True,
        )
        return ExecStream(self._hearing(self._ws.stream(waiting({"action": action}, self._wait_for_control_ms))))

    @property
    def processes(self) -> Processes:
        return Processes(self)

    @property
    def files(self) -> Files:
        return Files(self)


class AsyncExecs(AsyncConnected):
    """The async twin of :class:`Execs`."""

    async def exec(
        self,
        command: str | Sequence[str] | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = None,
        output_encoding: str | None = None,
    ) -> ExecResult:
        """Run ``command`` (a string, by ``bash -lc``; a list, as argv with no shell) or ``argv`` as the
        agent and wait for it to end; a non-zero exit is a result (``.check()`` raises on it), a timeout
        kills its whole tree (``timed_out``)."""
        action = commands.exec_action(
            command,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            output_encoding=output_encoding,
        )
        return await self._send(messages.exec(action))

    def exec_stream(
        self,
        command: str | Sequence[str] | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = 0,
        output_encoding: str | None = None,
    ) -> AsyncExecStream:
        """:meth:`exec`, its output given as it comes: iterate for :class:`OutputChunk`, then the result.
        ``max_output_bytes`` defaults to 0, as ``corral exec`` does: the chunks carry every byte, so the
        final result does not repeat them (give a size to have the result hold the output too)."""
        action = commands.exec_action(
            command,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            output_encoding=output_encoding,
            stream=True,
        )
        return AsyncExecStream(self._hearing(self._ws.stream(waiting({"action": action}, self._wait_for_control_ms))))

    @property
    def processes(self) -> AsyncProcesses:
        return AsyncProcesses(self)

    @property
    def files(self) -> AsyncFiles:
        return AsyncFiles(self)
