"""A stream's close with a bound: a peer that stopped reading keeps a closing socket's buffer full,
and ``wait_closed`` alone then waits for ever (docs/design/0475). The agent's own server can be that
peer (the preview door's and the tunnel's connections in the sandbox), and so can a preview's client
(the gateway's listener)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

CLOSE_WAIT_S: Final = 1.0  # how long a closing socket's buffer gets to drain before it is dropped


async def closed(writer: asyncio.StreamWriter) -> None:
    """``writer`` closed: its buffer flushed within :data:`CLOSE_WAIT_S`, else its transport aborted.
    ``asyncio.wait``'s timeout, not ``asyncio.timeout``: this runs in ``finally`` blocks of cancelled
    tasks, where Python 3.11.2's timeout raises CancelledError rather than TimeoutError when it expires,
    and the abort would be skipped."""
    writer.close()
    closing = asyncio.ensure_future(writer.wait_closed())
    try:
        await asyncio.wait({closing}, timeout=CLOSE_WAIT_S)
    finally:
        if not closing.done():
            writer.transport.abort()
        with contextlib.suppress(OSError):
            await closing
