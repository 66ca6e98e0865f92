"""The controller's idle trim: garbage collected and glibc's free pages handed back."""

from __future__ import annotations

import gc
import weakref

from corral.sandbox import trim


class _Node:
    other: object = None


def test_release_memory_collects_cycles_and_finds_malloc_trim() -> None:
    gc.disable()  # only release_memory may collect the cycle
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None
        trim.release_memory()
        assert gone() is None
    finally:
        gc.enable()
    assert trim._TRIM is not None  # glibc, as in the image: malloc_trim is found
