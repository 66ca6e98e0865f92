"""The agent's processes stopped while a human holds the control lease, and continued once it is back.

:class:`AgentFreezer` listens to the lease (corral.sandbox.control.lease): a human holder means frozen, anyone
else (the agent, an exclusive CDP connection, which is the agent's) means thawed. The work is the
launcher's (``freeze``/``thaw``, corral.sandbox.agent.launcher.sweep): every process of the agent's uid
stopped with SIGSTOP, setsid and double-forked ones included, and no program started until the thaw.

A human's take is answered, and each input of theirs runs, only once the freeze is done
(:meth:`AgentFreezer.frozen_for_human`): the person's first key never reaches a running agent process.
A freeze that did not hold refuses the human's input (``timeout``) and is tried again at the next;
a thaw that failed (the launcher restarting) is tried again every :data:`RETRY_S`. A controller that
starts thaws first: a restarted controller holds no human lease, so whatever an earlier one froze is
the agent's again. Shutdown thaws too.

A command's ``timeout_ms`` keeps counting while it is frozen (its budget is wall-clock time; one that
runs out meanwhile is killed as ever), and the agent's requests that wait for the lease
(``wait_for_control_ms``) start only after the thaw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from corral.contracts.actors import is_human
from corral.errors import ActionError, ErrorCode
from corral.sandbox.control.lease import Change, ControlLease

log = logging.getLogger(__name__)

# A thaw (or a freeze while a human still holds the lease) that failed is tried again this often.
RETRY_S = 1.0


class Sweeps(Protocol):
    """What freezes and thaws the agent's processes (corral.sandbox.agent.launcher.client.LauncherClient)."""

    # What the sweep reports: only logged here (corral.sandbox.agent.launcher.client.Frozen, Thawed).
    async def freeze(self) -> Mapping[str, object]: ...

    async def thaw(self) -> Mapping[str, object]: ...


class AgentFreezer:
    """See the module's text. Without a launcher (``sweeps`` None) there is nothing to freeze."""

    def __init__(
        self, lease: ControlLease, sweeps: Sweeps | None, before_thaw: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._lease = lease
        self._sweeps = sweeps
        # What must be gone before the agent's processes run again (the selections a person copied).
        self._before_thaw = before_thaw
        self._want = is_human(lease.holder.who)
        # What holds now: True frozen, False thawed, None unknown (at start, after a failure).
        self._applied: bool | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._unsubscribe = lease.subscribe(self._changed)
        self.last_freeze_ms: float | None = None  # how long the last freeze took (logged, measured)

    def start(self) -> None:
        """Starts the worker, whose first act is the thaw of whatever an earlier controller froze."""
        if self._sweeps is not None and self._worker is None:
            self._worker = asyncio.create_task(self._work())

    @property
    def frozen(self) -> bool:
        return self._applied is True

    def _changed(self, change: Change) -> None:
        self._want = is_human(change.state.holder.who)
        self._wake.set()

    async def _work(self) -> None:
        while True:
            await self.settle()
            self._wake.clear()
            if self._applied == self._want:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_S):
                        await self._wake.wait()

    async def settle(self) -> None:
        """One attempt to make what holds what the lease wants (nothing when it already is)."""
        if self._sweeps is None:
            return
        async with self._lock:
            want = self._want
            if self._applied == want:
                return
            started = time.perf_counter()
            if not want and self._applied is True and self._before_thaw is not None:
                # Only after a person's turn this controller froze for: at a start the agent may already
                # be acting (a cold start's first actions), and its own clipboard is its own.
                await self._forget_the_turn()
            try:
                result = await (self._sweeps.freeze() if want else self._sweeps.thaw())
            except (OSError, ConnectionError) as exc:
                self._applied = None
                log.error("the agent's processes could not be %s: %s", "stopped" if want else "continued", exc)
                return
            self._applied = want
            elapsed_ms = (time.perf_counter() - started) * 1000
            if want:
                self.last_freeze_ms = elapsed_ms
            log.info("the agent's processes %s in %.1f ms: %s", "stopped" if want else "continued", elapsed_ms, result)

    async def _forget_the_turn(self) -> None:
        """``before_thaw``, whose failure is logged and does not keep the agent frozen: a sandbox whose
        agent never runs again is no remedy for a clipboard that could not be emptied."""
        assert self._before_thaw is not None
        try:
            await self._before_thaw()
        except (OSError, ActionError) as exc:
            log.error("what the person's turn left behind could not be dropped before the thaw: %s", exc)

    async def thawed_for_agent(self) -> None:
        """Returns once a person's hand-back is done with (the selections emptied, the agent's processes
        continued): the agent's requests wait for it (corral.sandbox.dispatch), as its processes do. The
        lease is the agent's from the hand-back on, and a request of its own that ran meanwhile (a
        ``clipboard_set``) was emptied with what the person copied. Nothing to wait for otherwise; a
        thaw that failed is the worker's to try again, not each request's."""
        if self._sweeps is not None and self._applied is True and not self._want:
            await self.settle()

    async def frozen_for_human(self) -> None:
        """Returns once the agent's processes are stopped for the human holding the lease; raises
        :class:`ActionError` (``timeout``) when they could not all be stopped."""
        if self._sweeps is None:
            return
        await self.settle()
        if is_human(self._lease.holder.who) and self._applied is not True:
            raise ActionError(
                ErrorCode.TIMEOUT,
                "the agent's processes could not all be stopped; your input waits until they are (try again)",
            )

    async def close(self) -> None:
        """Shutdown: the worker stopped and the agent's processes continued."""
        self._unsubscribe()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        self._want = False
        await self.settle()
