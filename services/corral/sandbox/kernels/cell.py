"""Running one cell, as a small state machine over a narrow seam (:class:`Link`: send a request,
read the next message, interrupt): the request is sent, the kernel's messages are folded in until
it is idle and has replied; at the timeout the cell is interrupted (SIGINT) and given
``grace_s`` to come back idle. How it ended (:data:`Ending`) decides what the context does next
(:mod:`corral.sandbox.kernels.contexts`): keep the kernel, or restart it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from corral.errors import KernelGone
from corral.sandbox.kernels.collect import Cell, Event
from corral.sandbox.kernels.wire import Message

# After the shell's execute_reply, how long IOPub's idle may take before the cell counts as done
# anyway: a message of the kernel's over the frame cap drops the IOPub connection (ZeroMQ reconnects),
# losing what it carried, and the cell's end must not hang on it.
IDLE_AFTER_REPLY_S = 2.0

Ending = Literal["done", "timed_out", "hung", "died"]
"""done: the cell ran to its end; timed_out: interrupted at the timeout, the kernel idle again;
hung: still busy ``grace_s`` after the interrupt (the kernel must go); died: its process ended."""

Emit = Callable[[Event], Awaitable[None]]


class Link(Protocol):
    """A running kernel, as a cell sees it (corral.sandbox.kernels.channels.KernelLink)."""

    async def execute(self, code: str) -> str:
        """Send an ``execute_request``; its msg_id."""
        ...

    async def next(self) -> Message:
        """The next message from IOPub or the shell; KernelGone once the process ended and what it
        sent before is read."""
        ...

    def interrupt(self) -> None:
        """SIGINT to the kernel (as the agent, through the launcher)."""
        ...


async def run_cell(
    link: Link,
    code: str,
    *,
    timeout_s: float,
    grace_s: float,
    max_output_bytes: int,
    emit: Emit | None = None,
    idle_after_reply_s: float = IDLE_AFTER_REPLY_S,
    turn_over: Callable[[], Awaitable[None]] | None = None,
) -> tuple[Cell, Ending]:
    """``turn_over``: returns once no person holds the session's screen. A timeout that falls in a
    person's turn waits for it before the interrupt: the kernel is frozen (every agent process is)
    and could answer no SIGINT within ``grace_s``, so it would be killed and the agent's state lost
    for the person's turn, not for anything the cell did."""
    cell = Cell(await link.execute(code), max_output_bytes)

    async def until_done() -> None:
        while not cell.done:
            if cell.replied:
                try:
                    async with asyncio.timeout(idle_after_reply_s):
                        message = await link.next()
                except TimeoutError:
                    # Replied, its idle lost on IOPub: done, and IOPub must be joined again
                    # (KernelLink.rejoin) before the next cell; what it lost, the logs may lack.
                    cell.iopub_lost = cell.truncated = True
                    return
            else:
                message = await link.next()
            events = cell.take(message)
            if emit is not None:
                for event in events:
                    await emit(event)

    try:
        async with asyncio.timeout(timeout_s):
            await until_done()
        return cell, "done"
    except TimeoutError:
        pass
    except KernelGone:
        return cell, "died"
    if turn_over is not None:
        await turn_over()
    link.interrupt()
    try:
        async with asyncio.timeout(grace_s):
            await until_done()
        return cell, "timed_out"
    except TimeoutError:
        return cell, "hung"
    except KernelGone:
        return cell, "died"
