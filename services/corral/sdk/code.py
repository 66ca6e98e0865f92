"""The code interpreter, a part of each twin (:class:`Code`, :class:`AsyncCode`): ``run_code`` in a
kernel whose state lasts between calls (E2B's ``run_code``), and its contexts."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

from corral.client import Frame, is_reply
from corral.errors import CorralError
from corral.protocol import results as r
from corral.sdk.connection import AsyncConnected, Connected, waiting
from corral.sdk.execution import CodeEvent, Execution, ExecutionError, OutputMessage, Result, with_streamed
from corral.sdk.messages import Message, code_event, messages

T = TypeVar("T")
Handler = Callable[[T], object]
"""A callback: a plain function, or (in :class:`AsyncCode`) a coroutine function, which is awaited."""


class _Hearers:
    """Which callback hears each streamed event, and the error at the end (E2B's ``on_*``)."""

    def __init__(
        self,
        on_stdout: Handler[OutputMessage] | None,
        on_stderr: Handler[OutputMessage] | None,
        on_result: Handler[Result] | None,
        on_error: Handler[ExecutionError] | None,
    ) -> None:
        self.on_stdout, self.on_stderr, self.on_result, self.on_error = on_stdout, on_stderr, on_result, on_error

    @property
    def any(self) -> bool:
        return any(h is not None for h in (self.on_stdout, self.on_stderr, self.on_result, self.on_error))

    def call(self, event: CodeEvent) -> object:
        """The callback's return for ``event`` (a coroutine from an async one), None without one."""
        if isinstance(event, Result):
            return None if self.on_result is None else self.on_result(event)
        hearer = self.on_stderr if event.error else self.on_stdout
        return None if hearer is None else hearer(event)

    def ended(self, execution: Execution) -> object:
        return None if self.on_error is None or execution.error is None else self.on_error(execution.error)


def _message(code: str, language: str, context: str, timeout_ms: int | None, stream: bool) -> Message[Execution]:
    return messages.run_code(code, language, context, timeout_ms, stream)


class Code(Connected):
    """``run_code`` and the code contexts (docs/code.md)."""

    def run_code(
        self,
        code: str,
        *,
        language: str = "python",
        context: str = "default",
        timeout_ms: int | None = None,
        on_stdout: Handler[OutputMessage] | None = None,
        on_stderr: Handler[OutputMessage] | None = None,
        on_result: Handler[Result] | None = None,
        on_error: Handler[ExecutionError] | None = None,
    ) -> Execution:
        """Run ``code`` in the ``context``'s kernel (started on first use; its variables and imports
        last between calls) and answer its :class:`Execution`. A cell's exception is a result
        (``.error``), not a raise. With a callback the call streams: ``on_stdout``/``on_stderr`` hear
        each printed chunk and ``on_result`` each displayed result (a chart) as it comes, ``on_error``
        the cell's error at its end. At ``timeout_ms`` the cell is interrupted, the kernel kept."""
        hearers = _Hearers(on_stdout, on_stderr, on_result, on_error)
        message = _message(code, language, context, timeout_ms, hearers.any)
        if not hearers.any:
            return self._send(message)
        heard: list[CodeEvent] = []
        for frame in self._hearing(self._ws.stream(waiting(message.body, self._wait_for_control_ms))):
            if is_reply(frame):
                execution = with_streamed(message.read(frame), heard)
                hearers.ended(execution)
                return execution
            heard.append(event := code_event(frame))
            hearers.call(event)
        raise CorralError("the session's connection ended before the cell's result")

    def list_code_contexts(self) -> list[r.CodeContextInfo]:
        """The contexts whose kernels run (none until the first ``run_code``)."""
        return self._send(messages.list_code_contexts())

    def restart_code_context(self, context: str = "default") -> r.CodeContextInfo:
        """Start the context's kernel afresh: its variables are gone."""
        return self._send(messages.restart_code_context(context))

    def remove_code_context(self, context: str = "default") -> r.CodeContextRemoved:
        """Stop the context's kernel and forget it (``removed`` is False when none ran)."""
        return self._send(messages.remove_code_context(context))


async def _heard(answer: object) -> None:
    if inspect.isawaitable(answer):
        await answer


class AsyncCode(AsyncConnected):
    """The async twin of :class:`Code`; a callback may be a coroutine function (awaited in order)."""

    async def run_code(
        self,
        code: str,
        *,
        language: str = "python",
        context: str = "default",
        timeout_ms: int | None = None,
        on_stdout: Handler[OutputMessage] | None = None,
        on_stderr: Handler[OutputMessage] | None = None,
        on_result: Handler[Result] | None = None,
        on_error: Handler[ExecutionError] | None = None,
    ) -> Execution:
        """Run ``code`` in the ``context``'s kernel and answer its :class:`Execution` (see
        :meth:`Code.run_code`)."""
        hearers = _Hearers(on_stdout, on_stderr, on_result, on_error)
        message = _message(code, language, context, timeout_ms, hearers.any)
        if not hearers.any:
            return await self._send(message)
        heard: list[CodeEvent] = []
        frame: Frame
        async for frame in self._hearing(self._ws.stream(waiting(message.body, self._wait_for_control_ms))):
            if is_reply(frame):
                execution = with_streamed(message.read(frame), heard)
                await _heard(hearers.ended(execution))
                return execution
            heard.append(event := code_event(frame))
            await _heard(hearers.call(event))
        raise CorralError("the session's connection ended before the cell's result")

    async def list_code_contexts(self) -> list[r.CodeContextInfo]:
        """The contexts whose kernels run (none until the first ``run_code``)."""
        return await self._send(messages.list_code_contexts())

    async def restart_code_context(self, context: str = "default") -> r.CodeContextInfo:
        """Start the context's kernel afresh: its variables are gone."""
        return await self._send(messages.restart_code_context(context))

    async def remove_code_context(self, context: str = "default") -> r.CodeContextRemoved:
        """Stop the context's kernel and forget it (``removed`` is False when none ran)."""
        return await self._send(messages.remove_code_context(context))
