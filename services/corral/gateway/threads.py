"""Blocking calls in threads, awaited so that a cancellation never loses what a thread went on to make."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def settle(*futures: Awaitable[T]) -> tuple[list[T | BaseException], bool]:
    """Every result (or exception) of ``futures``, awaited to the end even when this task is
    cancelled meanwhile, and whether it was. A thread cannot be stopped: whatever it goes on to
    start must be known before it can be undone (a refill cancelled by a stopping gateway once
    left its proxy behind this way)."""
    gathered = asyncio.gather(*futures, return_exceptions=True)
    cancelled = False
    while True:
        try:
            results = await asyncio.shield(gathered)
        except asyncio.CancelledError:
            cancelled = True
            continue
        return list(results), cancelled


def in_thread(func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    return asyncio.ensure_future(asyncio.to_thread(func, *args))
