"""One running kernel: started through the process table as the agent (a background ``exec`` of the
agent's ``python3`` running :mod:`corral.sandbox.kernels.boot`), so it has exec's limits,
environment and process table, is frozen with the agent's processes while a human holds the
screen, and dies with the session; and its channels (:mod:`corral.sandbox.kernels.channels`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path

from corral.errors import ActionError, ErrorCode, KernelGone
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.agent.processes import KILL_WAIT_S, Process, ProcessTable, RunContext, signal_name
from corral.sandbox.kernels import wire
from corral.sandbox.kernels.channels import KernelLink
from corral.sandbox.kernels.ports import Ports, StartOutput

log = logging.getLogger(__name__)

BOOT = Path(__file__).with_name("boot.py")
AGENT_PYTHON = "python3"  # on the agent's PATH: Debian's, which sees the agent's user installs
KERNEL_ENV = {
    # plt.show() and a figure left at a cell's end become image/png results (ipykernel's inline backend).
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    # debugpy (an ipykernel dependency) warns on every start about Python's frozen modules.
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
}
REJOIN_TIMEOUT_S = 10.0  # a running kernel answers kernel_info at once; past this it is restarted


@dataclass(slots=True)
class Kernel:
    """A context's kernel: its process (in the process table), its channels, its count of cells."""

    name: str
    process: Process
    link: KernelLink
    started: float = field(default_factory=time.time)
    execution_count: int = 0
    busy: bool = False

    @property
    def alive(self) -> bool:
        return not self.process.main_done.is_set()

    async def execute(self, code: str) -> str:
        return await self.link.execute(code)

    async def next(self) -> wire.Message:
        return await self.link.next()

    def interrupt(self) -> None:
        self.link.interrupt()

    async def rejoin(self) -> None:
        await self.link.rejoin(REJOIN_TIMEOUT_S)

    def info(self) -> r.CodeContextInfo:
        return r.CodeContextInfo(
            name=self.name,
            language="python",
            state="busy" if self.busy else "idle",
            pid=self.process.pid,
            execution_count=self.execution_count,
            started=self.started,
        )

    def death(self) -> str:
        """Why the process ended, for KernelDied's value."""
        process = self.process
        if process.oom_killed:
            return "the kernel was killed by the sandbox's memory limit (out of memory)"
        name = signal_name(process.signal)
        if name is not None:
            return f"the kernel was killed by {name}"
        if process.exit_code is not None:
            return f"the kernel exited with status {process.exit_code}"
        return "the kernel's process ended"

    async def stop(self) -> None:
        """Its whole tree killed (the shepherd's), waited for."""
        self.link.close()
        if self.process.running:
            self.process.kill_tree()
            try:
                async with asyncio.timeout(KILL_WAIT_S):
                    await self.process.tree_done.wait()
            except TimeoutError:
                log.warning("the kernel %d's tree was not gone %.0f s after its kill", self.process.pid, KILL_WAIT_S)


async def start(processes: ProcessTable, name: str, action_id: str, timeout_s: float) -> Kernel:
    """A new kernel for the context ``name``, ready for its first cell; ``kernel_failed`` if it does
    not come up within ``timeout_s`` (its process is killed then)."""
    key, tag = wire.new_key(), secrets.token_hex(16)
    action = a.Exec(type="exec", argv=[AGENT_PYTHON, str(BOOT)], background=True, env=KERNEL_ENV)
    context = RunContext(action_id)
    started = await processes.start_private(action, context)
    output = StartOutput(tag)
    process = processes.watch(started.pid, lambda _stream, chunk: output.feed(chunk))  # both streams, as printed
    link: KernelLink | None = None
    try:
        async with asyncio.timeout(timeout_s):
            await process.write(json.dumps({"key": key.decode(), "tag": tag}).encode() + b"\n", eof=True)
            await _first(output.found.wait(), process.main_done.wait())
            if output.line is None:
                raise KernelGone("the kernel's process ended")
            ports = Ports.parse(output.line)
            link = KernelLink(ports, key, process.main_done, lambda: process.kill(signal.SIGINT))
            await link.ready(timeout_s)
    except (TimeoutError, KernelGone, ValueError, ActionError) as exc:
        kernel = Kernel(name, process, link) if link is not None else None
        reason = _start_failure(exc, process, timeout_s)
        if kernel is not None:
            await kernel.stop()
        elif process.running:
            process.kill_tree()
        printed = output.tail()
        detail = f"; it printed: {printed}" if printed else ""
        raise ActionError(
            ErrorCode.KERNEL_FAILED, f"the {name!r} context's kernel did not start: {reason}{detail}"
        ) from None
    except BaseException:
        # The caller went away during the start: no context holds this kernel, so it must not run on.
        if link is not None:
            link.close()
        process.kill_tree()
        raise
    finally:
        process.tap = None
    return Kernel(name, process, link)


def _start_failure(exc: Exception, process: Process, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"not ready within {timeout_s:.0f} s"
    if isinstance(exc, KernelGone) or not process.running:
        code = process.exit_code
        return f"it exited (status {code})" if code is not None else "its process ended"
    return str(exc)


async def _first(*waits: Coroutine[object, object, object]) -> None:
    """Until the first of ``waits`` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
