"""One cell's state machine over the narrow Link seam: done, timed out and kept, hung, died.
Timeouts of 0 expire at the first wait, so nothing sleeps."""

from __future__ import annotations

import asyncio

from corral.protocol import results as r
from corral.sandbox.kernels.cell import run_cell
from corral.sandbox.kernels.collect import Event

from .fakes import DIE, FakeKernel, finished, msg


async def test_a_cell_runs_to_its_end_and_streams_its_events() -> None:
    kernel = FakeKernel(
        [msg("stream", name="stdout", text="hi"), msg("execute_result", data={"text/plain": "1"}), *finished(4)]
    )
    sent: list[Event] = []

    async def emit(event: Event) -> None:
        sent.append(event)

    cell, ending = await run_cell(kernel, "1", timeout_s=60, grace_s=1, max_output_bytes=100, emit=emit)
    assert ending == "done" and kernel.codes == ["1"] and kernel.interrupts == 0
    assert cell.execution_count == 4 and cell.stdout == ["hi"]
    assert [type(e) for e in sent] == [r.OutputEvent, r.CodeResultEvent]


async def test_at_the_timeout_the_cell_is_interrupted_and_the_kernel_kept() -> None:
    interrupted = [msg("error", ename="KeyboardInterrupt", evalue="", traceback=["KeyboardInterrupt"]), *finished(2)]
    kernel = FakeKernel([msg("stream", name="stdout", text="started")], after_interrupt=interrupted)
    cell, ending = await run_cell(kernel, "loop", timeout_s=0, grace_s=60, max_output_bytes=100)
    assert ending == "timed_out" and kernel.interrupts == 1
    assert cell.stdout == ["started"] and cell.error is not None and cell.error.name == "KeyboardInterrupt"


async def test_a_kernel_still_busy_after_the_interrupt_is_hung() -> None:
    kernel = FakeKernel([msg("status", execution_state="busy")])
    _, ending = await run_cell(kernel, "ignore SIGINT", timeout_s=0, grace_s=0, max_output_bytes=100)
    assert ending == "hung" and kernel.interrupts == 1


async def test_a_kernel_whose_process_ends_died_with_what_it_sent_before() -> None:
    kernel = FakeKernel([msg("stream", name="stdout", text="last words"), DIE])
    cell, ending = await run_cell(kernel, "os._exit(1)", timeout_s=60, grace_s=1, max_output_bytes=100)
    assert ending == "died" and cell.stdout == ["last words"] and kernel.interrupts == 0


async def test_a_kernel_that_dies_after_the_interrupt_died() -> None:
    kernel = FakeKernel([], after_interrupt=[DIE])
    _, ending = await run_cell(kernel, "x", timeout_s=0, grace_s=60, max_output_bytes=100)
    assert ending == "died" and kernel.interrupts == 1


async def test_a_reply_whose_idle_never_comes_still_ends_the_cell() -> None:
    # A message over the frame cap drops IOPub's connection: what it carried (the idle too) is lost.
    kernel = FakeKernel([msg("stream", name="stdout", text="a"), finished()[0]])
    cell, ending = await run_cell(kernel, "x", timeout_s=60, grace_s=1, max_output_bytes=100, idle_after_reply_s=0)
    assert ending == "done" and cell.replied and not cell.idle and cell.stdout == ["a"]


async def test_a_timeout_in_a_persons_turn_waits_for_its_end_before_the_interrupt() -> None:
    # Frozen with every agent process, the kernel could answer no SIGINT in its grace: it would be
    # killed for the person's turn. The interrupt waits for the turn's end, then the cell stops as ever.
    interrupted = [msg("error", ename="KeyboardInterrupt", evalue="", traceback=["KeyboardInterrupt"]), *finished(2)]
    kernel = FakeKernel([msg("stream", name="stdout", text="started")], after_interrupt=interrupted)
    turn = asyncio.Event()

    async def turn_over() -> None:
        await turn.wait()

    running = asyncio.create_task(
        run_cell(kernel, "loop", timeout_s=0, grace_s=60, max_output_bytes=100, turn_over=turn_over)
    )
    for _ in range(5):
        await asyncio.sleep(0)
    assert kernel.interrupts == 0 and not running.done()
    turn.set()
    cell, ending = await running
    assert ending == "timed_out" and kernel.interrupts == 1 and cell.stdout == ["started"]
