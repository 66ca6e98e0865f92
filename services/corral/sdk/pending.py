"""A sandbox on its way (:class:`Pending`): what ``AsyncSandbox.create`` and ``attach`` answer, to be
awaited (``sb = await AsyncSandbox.create()``) or entered (``async with AsyncSandbox.create() as sb``),
as E2B's and httpx's are; ``async with await`` works too, the awaited sandbox being a context manager."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from corral.errors import CorralError


class _Entered(Protocol):
    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


S = TypeVar("S", bound=_Entered)


class Pending(Generic[S]):
    """One sandbox's start, run once: awaiting answers it; entering answers it and ends it at the
    block's end (its ``__aexit__``). Nothing starts until one of the two: a ``Pending`` left alone
    creates no session and leaves no coroutine unawaited."""

    def __init__(self, start: Callable[[], Coroutine[Any, Any, S]]) -> None:
        self._start = start
        self._started: Awaitable[S] | None = None
        self._entered: S | None = None

    def __await__(self) -> Generator[Any, None, S]:
        if self._started is not None:
            raise CorralError("this sandbox was already started: await AsyncSandbox.create() once")
        self._started = self._start()
        return self._started.__await__()

    async def __aenter__(self) -> S:
        self._entered = await self
        return self._entered

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._entered is not None:
            await self._entered.__aexit__(exc_type, exc, tb)


__all__ = ["Pending"]
