"""The code contexts over fake kernels (the Starter seam): lazy starts, the cap, and what each way a
cell ends does to its kernel and its answer."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable

import pytest

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.agent.processes import RunContext
from corral.sandbox.kernels.contexts import CodeContexts, KernelSettings, Running

from .fakes import DIE, FakeKernel, finished, msg

SETTINGS = KernelSettings(max_contexts=2, interrupt_grace_s=60, default_timeout_ms=60_000, max_timeout_ms=600_000)


class Kernels:
    """Starts a FakeKernel per call, each made by ``make`` (the nth start's), and keeps them."""

    def __init__(self, make: Callable[[int], FakeKernel] = lambda n: FakeKernel(finished(), pid=100 + n)) -> None:
        self.make = make
        self.started: list[tuple[str, str, FakeKernel]] = []

    async def __call__(self, name: str, action_id: str) -> Running:
        kernel = self.make(len(self.started))
        self.started.append((name, action_id, kernel))
        return kernel

    def kernel(self, n: int) -> FakeKernel:
        return self.started[n][2]


def code(text: str = "1", **fields: object) -> a.RunCode:
    return a.RunCode.model_validate({"type": "run_code", "code": text, **fields})


async def run(contexts: CodeContexts, text: str = "1", **fields: object) -> r.CodeExecution:
    result = await contexts.run(code(text, **fields), RunContext("a1.x"))
    assert isinstance(result, r.CodeExecution)
    return result


async def test_a_kernel_starts_on_the_first_call_that_names_its_context() -> None:
    kernels = Kernels()
    contexts = CodeContexts(kernels, SETTINGS)
    assert await contexts.run(a.ListCodeContexts(type="list_code_contexts"), RunContext("")) == r.CodeContextListing(
        contexts=[]
    )
    assert kernels.started == []
    result = await run(contexts, context="data")
    assert [(name, action) for name, action, _ in kernels.started] == [("data", "a1.x")]
    assert (result.context, result.execution_count, result.error, result.state_lost) == ("data", 1, None, False)
    await run(contexts, context="data")
    assert len(kernels.started) == 1 and kernels.kernel(0).codes == ["1", "1"]
    listing = await contexts.run(a.ListCodeContexts(type="list_code_contexts"), RunContext(""))
    assert isinstance(listing, r.CodeContextListing) and [c.pid for c in listing.contexts] == [100]


async def test_a_context_past_the_cap_is_refused_and_the_others_still_run() -> None:
    contexts = CodeContexts(Kernels(), SETTINGS)
    await run(contexts, context="one")
    await run(contexts, context="two")
    with pytest.raises(ActionError) as refused:
        await run(contexts, context="three")
    assert (refused.value.code, refused.value.field) == (ErrorCode.CODE_CONTEXT_LIMIT, "action.context")
    assert "remove_code_context" in refused.value.message
    assert (await run(contexts, context="one")).error is None
    await contexts.remove("one")
    assert (await run(contexts, context="three")).error is None


async def test_a_timeout_interrupts_and_keeps_the_kernel() -> None:
    after = [
        msg("error", ename="KeyboardInterrupt", evalue="", traceback=["Cell In[1]\nKeyboardInterrupt"]),
        *finished(),
    ]
    kernels = Kernels(lambda n: FakeKernel([], after_interrupt=after))
    contexts = CodeContexts(kernels, KernelSettings(interrupt_grace_s=60))
    result = await run(contexts, "loop", timeout_ms=1)
    assert result.timed_out and not result.state_lost and result.error is not None
    assert (
        result.error.name == "Timeout"
        and "1 ms" in result.error.value
        and "KeyboardInterrupt" in result.error.traceback
    )
    assert len(kernels.started) == 1 and not kernels.kernel(0).stopped


async def test_a_hung_kernel_is_killed_and_started_afresh() -> None:
    kernels = Kernels(lambda n: FakeKernel([] if n == 0 else finished(), pid=100 + n))
    contexts = CodeContexts(kernels, KernelSettings(interrupt_grace_s=0))
    result = await run(contexts, "ignore SIGINT", timeout_ms=1)
    assert result.timed_out and result.state_lost and result.error is not None
    assert result.error.name == "KernelRestarted" and "SIGINT" in result.error.value
    assert kernels.kernel(0).stopped and kernels.kernel(0).interrupts == 1 and len(kernels.started) == 2
    assert (await run(contexts)).error is None and kernels.kernel(1).codes == ["1"]


async def test_a_dead_kernel_is_reported_and_the_next_call_starts_a_new_one() -> None:
    kernels = Kernels(lambda n: FakeKernel([DIE] if n == 0 else finished(), pid=100 + n))
    contexts = CodeContexts(kernels, SETTINGS)
    result = await run(contexts, "x = b'x' * huge")
    assert result.state_lost and not result.timed_out and result.error is not None
    assert result.error.name == "KernelDied" and "memory" in result.error.value
    assert kernels.kernel(0).stopped and len(kernels.started) == 1
    again = await run(contexts)
    assert again.error is None and not again.state_lost and len(kernels.started) == 2


async def test_a_kernel_that_died_between_calls_is_replaced_and_says_so() -> None:
    kernels = Kernels()
    contexts = CodeContexts(kernels, SETTINGS)
    await run(contexts)
    kernels.kernel(0).dead = True  # killed by hand (process_kill) while no cell ran
    result = await run(contexts)
    assert result.state_lost and result.error is None and len(kernels.started) == 2


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"timeout_ms": 600_001}, "action.timeout_ms"), ({"max_output_bytes": (8 << 20) + 1}, "action.max_output_bytes")],
)
async def test_limits_past_the_caps_are_refused_before_any_start(fields: dict[str, object], field: str) -> None:
    kernels = Kernels()
    with pytest.raises(ActionError) as refused:
        await run(CodeContexts(kernels, SETTINGS), **fields)
    assert (refused.value.code, refused.value.field) == (ErrorCode.INVALID_FIELD, field)
    assert kernels.started == []


async def test_a_kernel_that_cannot_start_leaves_the_context_to_try_again() -> None:
    failures = [ActionError(ErrorCode.KERNEL_FAILED, "no ipykernel")]
    kernels = Kernels()

    async def starter(name: str, action_id: str) -> Running:
        if failures:
            raise failures.pop()
        return await kernels(name, action_id)

    contexts = CodeContexts(starter, SETTINGS)
    with pytest.raises(ActionError) as refused:
        await run(contexts)
    assert refused.value.code == ErrorCode.KERNEL_FAILED
    assert (await run(contexts)).error is None


async def test_restart_and_remove() -> None:
    kernels = Kernels()
    contexts = CodeContexts(kernels, SETTINGS)
    await run(contexts, context="c")
    info = await contexts.run(a.RestartCodeContext(type="restart_code_context", context="c"), RunContext("a2.x"))
    assert isinstance(info, r.CodeContextInfo) and info.pid == 101 and kernels.kernel(0).stopped
    removed = await contexts.run(a.RemoveCodeContext(type="remove_code_context", context="c"), RunContext(""))
    assert removed == r.CodeContextRemoved(name="c", removed=True) and kernels.kernel(1).stopped
    again = await contexts.run(a.RemoveCodeContext(type="remove_code_context", context="c"), RunContext(""))
    assert again == r.CodeContextRemoved(name="c", removed=False)


async def test_the_events_go_to_the_requests_emitter() -> None:
    kernels = Kernels(lambda n: FakeKernel([msg("stream", name="stdout", text="a"), *finished()]))
    sent: list[object] = []

    async def emit(event: r.OutputEvent | r.CodeResultEvent) -> None:
        sent.append(event)

    contexts = CodeContexts(kernels, SETTINGS)
    await contexts.run(code(stream=True), RunContext("a1", emit))
    assert sent == [r.OutputEvent(stream="stdout", data="a", encoding="utf-8")]
    await contexts.run(code(), RunContext("a2", emit))  # not asked to stream: the reply alone
    assert len(sent) == 1


async def test_close_stops_every_kernel() -> None:
    kernels = Kernels()
    contexts = CodeContexts(kernels, SETTINGS)
    await run(contexts, context="one")
    await run(contexts, context="two")
    await contexts.close()
    assert all(kernel.stopped for _, _, kernel in kernels.started)


def test_the_controller_loads_no_zeromq_until_a_kernel_starts() -> None:
    # A session that never runs code pays nothing for the kernels' wire (pyzmq and its library).
    probe = "import sys, corral.sandbox.app; print(sorted(m for m in sys.modules if 'zmq' in m))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_a_dropped_iopub_is_joined_again_and_the_kernel_kept() -> None:
    lost_idle = [msg("stream", name="stdout", text="a"), finished()[0]]  # the reply, no idle
    kernels = Kernels(lambda n: FakeKernel(lost_idle))
    contexts = CodeContexts(kernels, KernelSettings(idle_after_reply_s=0))
    result = await run(contexts)
    assert result.error is None and not result.state_lost and result.logs.truncated
    assert kernels.kernel(0).rejoins == 1 and not kernels.kernel(0).stopped and len(kernels.started) == 1


async def test_a_kernel_whose_iopub_cannot_be_joined_again_is_replaced() -> None:
    def make(n: int) -> FakeKernel:
        kernel = FakeKernel([finished()[0]] if n == 0 else finished(), pid=100 + n)
        kernel.rejoinable = n > 0
        return kernel

    kernels = Kernels(make)
    contexts = CodeContexts(kernels, KernelSettings(idle_after_reply_s=0))
    result = await run(contexts)
    assert result.state_lost and not result.timed_out and result.error is not None
    assert result.error.name == "KernelRestarted" and "IOPub" in result.error.value
    assert kernels.kernel(0).stopped and len(kernels.started) == 2


class StoppedDies(FakeKernel):
    """A kernel whose stop ends the cell running in it, as the real one's closed channels do."""

    async def stop(self) -> None:
        await super().stop()
        self.queue.put_nowait(DIE)


async def test_a_call_waiting_on_a_removed_context_starts_no_kernel_outside_the_contexts() -> None:
    # The agent runs a long cell in "c", queues a second call on "c" and removes "c": the queued call
    # must not start a kernel in the removed context (unlisted, uncounted, never removed), or any
    # number of kernels would run past max_contexts.
    kernels = Kernels(lambda n: StoppedDies([] if n == 0 else finished(), pid=100 + n))
    contexts = CodeContexts(kernels, SETTINGS)
    first = asyncio.ensure_future(run(contexts, context="c"))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(run(contexts, context="c"))
    await asyncio.sleep(0)
    assert (await contexts.remove("c")).removed is True
    assert (await first).error is not None and (await first).error.name == "KernelDied"  # type: ignore[union-attr]
    assert (await queued).error is None
    listing = await contexts.run(a.ListCodeContexts(type="list_code_contexts"), RunContext(""))
    assert isinstance(listing, r.CodeContextListing)
    assert [c.pid for c in listing.contexts] == [101]  # the queued call's kernel is the context "c"'s
    await run(contexts, context="d")
    with pytest.raises(ActionError):  # two contexts, the cap: no kernel beyond it
        await run(contexts, context="e")
    await contexts.close()
    assert all(kernel.stopped for _, _, kernel in kernels.started)
