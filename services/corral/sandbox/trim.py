"""Give the controller's freed heap back to the system once it is idle.

glibc keeps what Python frees (screen frames of 4 MiB, an action's replies, the Playwright link's
objects) in its arenas for reuse; an idle session need not hold it. ``malloc_trim(0)`` returns every
whole free page of every arena (madvise), a few ms of one core, never on an action's path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time

log = logging.getLogger(__name__)


def _malloc_trim() -> ctypes._NamedFuncPointer | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Collect Python's garbage, then hand glibc's free pages back (no-op where there is no malloc_trim)."""
    start = time.perf_counter()
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
    log.info("gave freed memory back in %.0f ms", (time.perf_counter() - start) * 1000)
