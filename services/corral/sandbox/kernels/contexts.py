"""The session's code contexts: each a name and, once ``run_code`` first names it, a kernel
(:mod:`corral.sandbox.kernels.kernel`). The code actions (``run_code``, ``list_code_contexts``,
``restart_code_context``, ``remove_code_context``) run here, beside the desktop's lock like an
``exec``; one cell at a time per context (another call on it waits its turn).

How a call ends decides the kernel's fate (:data:`corral.sandbox.kernels.cell.Ending`): at the
timeout the cell is interrupted and the kernel kept; a kernel still busy ``interrupt_grace_s``
later is killed and started afresh (``KernelRestarted``, ``state_lost``); a kernel whose process
ended (the memory limit, ``os._exit``, a crash) is reported (``KernelDied``, ``state_lost``) and
the next call starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, assert_never

from corral.errors import ActionError, ErrorCode, KernelGone
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.agent.processes import ProcessTable, RunContext
from corral.sandbox.kernels.cell import IDLE_AFTER_REPLY_S, Ending, Link, run_cell
from corral.sandbox.kernels.collect import Cell


@dataclass(frozen=True, slots=True)
class KernelSettings:
    """The code actions' limits (from ControllerSettings; timeouts and output caps are exec's)."""

    max_contexts: int = 8
    start_timeout_s: float = 60.0
    interrupt_grace_s: float = 3.0
    idle_after_reply_s: float = IDLE_AFTER_REPLY_S
    default_timeout_ms: int = 60_000
    max_timeout_ms: int = 600_000
    output_bytes: int = 1 << 20
    max_output_bytes: int = 8 << 20


class Running(Link, Protocol):
    """A started kernel as the contexts see it (corral.sandbox.kernels.kernel.Kernel behind it;
    a fake in the unit tests)."""

    execution_count: int
    busy: bool

    def info(self) -> r.CodeContextInfo: ...

    def death(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    async def stop(self) -> None: ...

    async def rejoin(self) -> None:
        """IOPub joined again after its connection was dropped; TimeoutError or KernelGone if not."""
        ...


Outcome = Ending | Literal["unreadable"]
"""How a cell ended for its kernel: a cell's :data:`Ending`, or ``unreadable``: its IOPub was
dropped and could not be joined again."""

Starter = Callable[[str, str], Awaitable[Running]]
"""Starts the kernel of a context: (context name, action id) -> its kernel, or ActionError."""


@dataclass(slots=True)
class _Context:
    name: str
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    kernel: Running | None = None


Result = r.CodeExecution | r.CodeContextListing | r.CodeContextInfo | r.CodeContextRemoved


class CodeContexts:
    """The contexts of this session, by name."""

    def __init__(
        self, starter: Starter, settings: KernelSettings, turn_over: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``turn_over``: returns once no person holds the screen (the lease's
        :meth:`~corral.sandbox.control.lease.ControlLease.no_human`); a cell's timeout that falls in a
        person's turn waits for it before its interrupt."""
        self._starter = starter
        self._settings = settings
        self._contexts: dict[str, _Context] = {}
        self._turn_over = turn_over

    @classmethod
    def over(
        cls, processes: ProcessTable, settings: KernelSettings, turn_over: Callable[[], Awaitable[None]] | None = None
    ) -> CodeContexts:
        """Contexts whose kernels the process table starts (the real ones)."""

        async def starter(name: str, action_id: str) -> Running:
            from corral.sandbox.kernels import kernel  # pyzmq loads with the first kernel, not before

            return await kernel.start(processes, name, action_id, settings.start_timeout_s)

        return cls(starter, settings, turn_over)

    async def run(self, action: a.CodeAction, context: RunContext) -> Result:
        match action:
            case a.RunCode():
                return await self.run_code(action, context)
            case a.ListCodeContexts():
                return r.CodeContextListing(
                    contexts=[c.kernel.info() for c in self._contexts.values() if c.kernel and c.kernel.alive]
                )
            case a.RestartCodeContext():
                return await self.restart(action.context, context.action_id)
            case a.RemoveCodeContext():
                return await self.remove(action.context)
            case _:
                assert_never(action)

    async def close(self) -> None:
        """The controller's end: every kernel stopped (the process table would kill them anyway)."""
        for ctx in list(self._contexts.values()):
            if ctx.kernel is not None:
                await ctx.kernel.stop()
        self._contexts.clear()

    # -- run_code ----------------------------------------------------------------------------------------

    def _limits(self, action: a.RunCode) -> tuple[int, int]:
        settings = self._settings
        timeout = action.timeout_ms or settings.default_timeout_ms
        if timeout > settings.max_timeout_ms:
            raise ActionError(
                ErrorCode.INVALID_FIELD, f"timeout_ms is at most {settings.max_timeout_ms}", "action.timeout_ms"
            )
        output = settings.output_bytes if action.max_output_bytes is None else action.max_output_bytes
        if output > settings.max_output_bytes:
            message = f"max_output_bytes is at most {settings.max_output_bytes}"
            raise ActionError(ErrorCode.INVALID_FIELD, message, "action.max_output_bytes")
        return timeout, output

    def _context(self, name: str) -> _Context:
        ctx = self._contexts.get(name)
        if ctx is not None:
            return ctx
        if len(self._contexts) >= self._settings.max_contexts:
            raise ActionError(
                ErrorCode.CODE_CONTEXT_LIMIT,
                f"{len(self._contexts)} code contexts exist; at most {self._settings.max_contexts} "
                "(remove_code_context frees one)",
                "action.context",
            )
        ctx = self._contexts[name] = _Context(name)
        return ctx

    @contextlib.asynccontextmanager
    async def _held(self, name: str) -> AsyncIterator[_Context]:
        """The context ``name``, its turn held. One removed while the call waited for its turn is
        not used: a kernel started in it would run outside the contexts (unlisted, past their cap,
        never removed); the name is looked up again, as a call made after the removal would."""
        while True:
            ctx = self._context(name)
            async with ctx.turn:
                if self._contexts.get(name) is ctx:
                    yield ctx
                    return

    async def run_code(self, action: a.RunCode, context: RunContext) -> r.CodeExecution:
        timeout_ms, output_bytes = self._limits(action)
        began = time.perf_counter()
        async with self._held(action.context) as ctx:
            state_lost = False
            if ctx.kernel is not None and not ctx.kernel.alive:
                await ctx.kernel.stop()  # died between calls: that call's answer did not say so
                ctx.kernel, state_lost = None, True
            if ctx.kernel is None:
                ctx.kernel = await self._start(ctx.name, context.action_id)
            kernel = ctx.kernel
            kernel.busy = True
            try:
                cell, ending = await run_cell(
                    kernel,
                    action.code,
                    timeout_s=timeout_ms / 1000,
                    grace_s=self._settings.interrupt_grace_s,
                    max_output_bytes=output_bytes,
                    emit=context.emit if action.stream else None,
                    idle_after_reply_s=self._settings.idle_after_reply_s,
                    turn_over=self._turn_over,
                )
            except BaseException:
                # The caller went away mid-cell: the cell is interrupted, the kernel kept (as a timeout).
                if kernel.alive:
                    kernel.interrupt()
                kernel.busy = False
                raise
            kernel.busy = False
            if cell.execution_count is not None:
                kernel.execution_count = cell.execution_count
            outcome: Outcome = ending
            if ending == "done" and cell.iopub_lost and not await _rejoined(kernel):
                outcome = "unreadable"
            error = await self._ended(ctx, kernel, outcome, timeout_ms, context.action_id)
        return r.CodeExecution(
            context=ctx.name,
            language="python",
            results=cell.results,
            logs=cell.logs(),
            error=error or _timeout_error(ending, timeout_ms, cell) or cell.error,
            execution_count=cell.execution_count,
            timed_out=ending in ("timed_out", "hung"),
            state_lost=state_lost or outcome in ("hung", "died", "unreadable"),
            duration_ms=round((time.perf_counter() - began) * 1000, 2),
        )

    async def _ended(
        self, ctx: _Context, kernel: Running, ending: Outcome, timeout_ms: int, action_id: str
    ) -> r.CodeError | None:
        """What the kernel's end of a cell means: nothing, or the error that replaces the cell's."""
        if ending == "died":
            ctx.kernel = None
            await kernel.stop()
            return r.CodeError(
                name="KernelDied",
                value=f"{kernel.death()}; its state is lost: the next call starts a new one",
                traceback="",
            )
        if ending in ("hung", "unreadable"):
            ctx.kernel = None
            await kernel.stop()
            grace = self._settings.interrupt_grace_s
            value = (
                f"the cell ran past timeout_ms ({timeout_ms} ms) and the kernel was still busy {grace:g} s after "
                "its interrupt (SIGINT), so it was killed and started afresh: its state is lost"
                if ending == "hung"
                else "the kernel sent a message over the frame cap, which dropped its output channel (IOPub), and "
                "the channel could not be joined again, so it was killed and started afresh: its state is lost"
            )
            ctx.kernel = await self._start(ctx.name, action_id)
            return r.CodeError(name="KernelRestarted", value=value, traceback="")
        return None

    async def _start(self, name: str, action_id: str) -> Running:
        return await self._starter(name, action_id)

    # -- the other actions -------------------------------------------------------------------------------

    async def restart(self, name: str, action_id: str) -> r.CodeContextInfo:
        old = self._context(name).kernel
        if old is not None and old.busy:
            old.interrupt()  # a running cell would hold the turn until its timeout
        async with self._held(name) as ctx:
            if ctx.kernel is not None:
                await ctx.kernel.stop()
                ctx.kernel = None
            ctx.kernel = await self._start(name, action_id)
            return ctx.kernel.info()

    async def remove(self, name: str) -> r.CodeContextRemoved:
        ctx = self._contexts.pop(name, None)
        if ctx is None:
            return r.CodeContextRemoved(name=name, removed=False)
        kernel = ctx.kernel
        ctx.kernel = None
        if kernel is not None:
            await kernel.stop()  # a cell running in it ends with KernelDied
        return r.CodeContextRemoved(name=name, removed=True)


async def _rejoined(kernel: Running) -> bool:
    """Whether IOPub, dropped during the cell, was joined again (else the kernel must be replaced)."""
    try:
        await kernel.rejoin()
    except (TimeoutError, KernelGone):
        return False
    return True


def _timeout_error(ending: Ending, timeout_ms: int, cell: Cell) -> r.CodeError | None:
    """A cell interrupted at its timeout: Timeout, with the interrupt's traceback (where it stopped)."""
    if ending != "timed_out":
        return None
    value = f"the cell ran past timeout_ms ({timeout_ms} ms) and was interrupted; the kernel and its state are kept"
    return r.CodeError(name="Timeout", value=value, traceback=cell.error.traceback if cell.error else "")
