"""A kernel at the narrow seam the cells and contexts use (corral.sandbox.kernels.cell.Link,
contexts.Running): scripted messages, an interrupt that releases more, a death."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from corral.errors import KernelGone
from corral.protocol import results as r
from corral.sandbox.kernels.wire import Message

CELL = "cell-1"


def msg(msg_type: str, parent: str | None = CELL, **content: object) -> Message:
    return Message(msg_type, f"k-{msg_type}", parent, dict(content))


def finished(count: int = 1) -> list[Message]:
    """What a kernel sends as a cell ends: its reply, then idle."""
    return [msg("execute_reply", status="ok", execution_count=count), msg("status", execution_state="idle")]


DIE = msg("corral-test-die")


class FakeKernel:
    """Answers each cell with ``script``; on interrupt, sends ``after_interrupt`` (nothing: it is hung)."""

    def __init__(self, script: Sequence[Message] = (), after_interrupt: Sequence[Message] = (), pid: int = 100) -> None:
        self.script = list(script)
        self.after_interrupt = list(after_interrupt)
        self.queue: asyncio.Queue[Message] = asyncio.Queue()
        self.codes: list[str] = []
        self.interrupts = 0
        self.stopped = False
        self.dead = False
        self.pid = pid
        self.execution_count = 0
        self.busy = False
        self.rejoins = 0
        self.rejoinable = True

    async def execute(self, code: str) -> str:
        self.codes.append(code)
        for message in self.script:
            self.queue.put_nowait(message)
        return CELL

    async def next(self) -> Message:
        message = await self.queue.get()  # suspends when the script is spent: the cell runs on
        if message is DIE:
            self.dead = True
            raise KernelGone("gone")
        return message

    def interrupt(self) -> None:
        self.interrupts += 1
        for message in self.after_interrupt:
            self.queue.put_nowait(message)

    @property
    def alive(self) -> bool:
        return not self.dead and not self.stopped

    def info(self) -> r.CodeContextInfo:
        state = "busy" if self.busy else "idle"
        return r.CodeContextInfo(
            name="n", language="python", state=state, pid=self.pid, execution_count=self.execution_count, started=1.0
        )

    def death(self) -> str:
        return "the kernel was killed by the sandbox's memory limit (out of memory)"

    async def stop(self) -> None:
        self.stopped = True

    async def rejoin(self) -> None:
        self.rejoins += 1
        if not self.rejoinable:
            raise TimeoutError
