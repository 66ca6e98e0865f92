"""``sb.exec_stream(...)``: a command's output as it comes, then its result, in each twin."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any, Self

from corral.client import Frame, is_reply
from corral.commands import ExecResult, OutputChunk
from corral.sdk.messages import exec_result


class ExecStream:
    """``for item in sb.exec_stream(...)``: :class:`OutputChunk` as the command prints, then its
    :class:`ExecResult` (last; also kept as :attr:`result`). The command starts when iteration does."""

    def __init__(self, frames: Iterator[Frame]) -> None:
        self._frames = frames
        self.result: ExecResult | None = None

    def __iter__(self) -> Iterator[OutputChunk | ExecResult]:
        for frame in self._frames:
            if is_reply(frame):
                self.result = exec_result(frame)
                yield self.result
            else:
                yield OutputChunk.from_event(frame)

    def close(self) -> None:
        """Stop reading (the command goes on; its later output is dropped)."""
        close = getattr(self._frames, "close", None)
        if close is not None:
            close()


class AsyncExecStream:
    """The async twin of :class:`ExecStream`: ``async for item in sb.exec_stream(...)`` (the command
    starts at the first item). ``await sb.exec_stream(...)`` gives the same stream, for code written
    when the method was a coroutine."""

    def __init__(self, frames: AsyncIterator[Frame]) -> None:
        self._frames = frames
        self.result: ExecResult | None = None

    def __await__(self) -> Generator[Any, None, Self]:
        return self._itself().__await__()

    async def _itself(self) -> Self:
        return self

    async def __aiter__(self) -> AsyncIterator[OutputChunk | ExecResult]:
        async for frame in self._frames:
            if is_reply(frame):
                self.result = exec_result(frame)
                yield self.result
            else:
                yield OutputChunk.from_event(frame)

    async def aclose(self) -> None:
        close = getattr(self._frames, "aclose", None)
        if close is not None:
            await close()
