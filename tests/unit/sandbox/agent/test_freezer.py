"""AgentFreezer (corral.sandbox.agent.freezer): the agent's processes frozen exactly while a human holds the
lease, with the launcher's sweeps replaced by a recorder of calls (the narrow seam)."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import pytest

from corral.contracts.actors import AGENT
from corral.errors import ActionError, ErrorCode
from corral.sandbox.agent.freezer import AgentFreezer
from corral.sandbox.control.lease import ControlLease

HUMAN = "human:lnk_1"


class Sweeps:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_freeze = False
        self.fail_thaw = 0  # how many thaws fail before one works
        self.thawed = asyncio.Event()
        self.gate: asyncio.Event | None = None  # set: the freeze waits for it

    async def freeze(self) -> dict[str, Any]:
        self.calls.append("freeze")
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_freeze:
            raise OSError(errno.ETIMEDOUT, "did not stop")
        return {"processes": 3}

    async def thaw(self) -> dict[str, Any]:
        self.calls.append("thaw")
        if self.fail_thaw > 0:
            self.fail_thaw -= 1
            raise ConnectionError("the launcher restarts")
        self.thawed.set()
        return {"continued": 3}


async def settled(freezer: AgentFreezer) -> None:
    for _ in range(50):
        await asyncio.sleep(0)
    await freezer.settle()


async def test_a_started_controller_thaws_first_and_a_human_take_freezes_before_it_answers() -> None:
    lease, sweeps = ControlLease(), Sweeps()
    freezer = AgentFreezer(lease, sweeps)
    freezer.start()
    await settled(freezer)
    assert sweeps.calls == ["thaw"]  # whatever an earlier controller froze
    lease.take(HUMAN)
    await freezer.frozen_for_human()
    assert freezer.frozen and sweeps.calls == ["thaw", "freeze"]
    await freezer.frozen_for_human()  # already frozen: no second sweep
    assert sweeps.calls == ["thaw", "freeze"]
    lease.release(HUMAN)
    await settled(freezer)
    assert not freezer.frozen and sweeps.calls == ["thaw", "freeze", "thaw"]
    await freezer.close()
    assert sweeps.calls == ["thaw", "freeze", "thaw"]  # thawed already


async def test_the_input_waits_for_a_freeze_under_way() -> None:
    lease, sweeps = ControlLease(), Sweeps()
    sweeps.gate = asyncio.Event()
    freezer = AgentFreezer(lease, sweeps)
    lease.take(HUMAN)
    waiting = asyncio.create_task(freezer.frozen_for_human())
    for _ in range(50):
        await asyncio.sleep(0)
    assert not waiting.done()  # the person's input does not run while agent processes still run
    sweeps.gate.set()
    await waiting
    assert freezer.frozen


async def test_a_freeze_that_fails_refuses_the_human_and_is_tried_again() -> None:
    lease, sweeps = ControlLease(), Sweeps()
    sweeps.fail_freeze = True
    freezer = AgentFreezer(lease, sweeps)
    lease.take(HUMAN)
    with pytest.raises(ActionError) as refused:
        await freezer.frozen_for_human()
    assert refused.value.code == ErrorCode.TIMEOUT
    sweeps.fail_freeze = False
    await freezer.frozen_for_human()
    assert sweeps.calls == ["freeze", "freeze"] and freezer.frozen
    # Handed back after a partial freeze: a thaw, whatever held.
    lease.release(HUMAN)
    await freezer.settle()
    assert sweeps.calls[-1] == "thaw"


async def test_an_exclusive_cdp_holder_is_the_agent_s_own_and_freezes_nothing() -> None:
    lease, sweeps = ControlLease(), Sweeps()
    freezer = AgentFreezer(lease, sweeps)
    lease.attach("cdp:c1")
    lease.take("cdp:c1")
    await freezer.settle()
    assert sweeps.calls == ["thaw"] and not freezer.frozen
    lease.take(HUMAN)  # a human takes it from the CDP connection: frozen
    await freezer.frozen_for_human()
    lease.release(HUMAN)  # back to the CDP connection: thawed
    await freezer.settle()
    assert lease.holder.who == "cdp:c1" and sweeps.calls == ["thaw", "freeze", "thaw"]


async def test_a_failed_thaw_is_tried_again_by_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("corral.sandbox.agent.freezer.RETRY_S", 0)
    lease, sweeps = ControlLease(), Sweeps()
    sweeps.fail_thaw = 2
    freezer = AgentFreezer(lease, sweeps)
    freezer.start()
    async with asyncio.timeout(5):
        await sweeps.thawed.wait()
    assert sweeps.calls == ["thaw", "thaw", "thaw"] and lease.holder.who == AGENT
    await freezer.close()


async def test_shutdown_thaws_a_frozen_agent() -> None:
    lease, sweeps = ControlLease(), Sweeps()
    freezer = AgentFreezer(lease, sweeps)
    lease.take(HUMAN)
    await freezer.frozen_for_human()
    await freezer.close()  # the human still holds it: the sandbox is going away
    assert sweeps.calls == ["freeze", "thaw"] and not freezer.frozen


async def test_without_a_launcher_nothing_is_frozen_and_nothing_refused() -> None:
    lease = ControlLease()
    freezer = AgentFreezer(lease, None)
    freezer.start()
    lease.take(HUMAN)
    await freezer.frozen_for_human()
    assert not freezer.frozen


async def test_what_the_person_left_in_the_selections_is_dropped_before_every_thaw() -> None:
    lease, sweeps = ControlLease(), Sweeps()
    calls = sweeps.calls

    async def forget() -> None:
        calls.append("forget")

    freezer = AgentFreezer(lease, sweeps, before_thaw=forget)
    freezer.start()
    await settled(freezer)
    lease.take(HUMAN)
    await freezer.frozen_for_human()
    lease.release(HUMAN)
    await settled(freezer)
    # At the hand-back only: not at the start's thaw (the agent may be acting already), never at the freeze.
    assert calls == ["thaw", "freeze", "forget", "thaw"]
    await freezer.close()


async def test_selections_that_cannot_be_emptied_do_not_keep_the_agent_frozen() -> None:
    lease, sweeps = ControlLease(), Sweeps()

    async def fails() -> None:
        raise ActionError(ErrorCode.CLIPBOARD_FAILED, "xclip did not answer in time")

    freezer = AgentFreezer(lease, sweeps, before_thaw=fails)
    lease.take(HUMAN)
    await freezer.frozen_for_human()
    lease.release(HUMAN)
    await freezer.settle()
    assert not freezer.frozen and sweeps.calls == ["freeze", "thaw"]


async def test_the_agents_request_after_a_hand_back_waits_for_the_emptying_and_the_thaw() -> None:
    lease, sweeps = ControlLease(), Sweeps()
    emptying = asyncio.Event()
    calls = sweeps.calls

    async def forget() -> None:
        calls.append("forget")
        await emptying.wait()

    freezer = AgentFreezer(lease, sweeps, before_thaw=forget)
    freezer.start()
    await settled(freezer)
    await freezer.thawed_for_agent()  # nothing of a person's to wait for: answers at once
    lease.take(HUMAN)
    await freezer.frozen_for_human()
    lease.release(HUMAN)
    # The lease is the agent's at once; its request waits while the worker empties the selections.
    waiting = asyncio.create_task(freezer.thawed_for_agent())
    for _ in range(50):
        await asyncio.sleep(0)
    assert calls == ["thaw", "freeze", "forget"] and not waiting.done()
    emptying.set()
    await waiting
    assert calls == ["thaw", "freeze", "forget", "thaw"] and not freezer.frozen
    await freezer.close()


async def test_a_failed_thaw_does_not_hold_the_agents_requests() -> None:
    lease, sweeps = ControlLease(), Sweeps()
    freezer = AgentFreezer(lease, sweeps)
    lease.take(HUMAN)
    await freezer.frozen_for_human()
    lease.release(HUMAN)
    sweeps.fail_thaw = 1
    await freezer.thawed_for_agent()  # the one attempt, failed: the worker tries again, not each request
    assert sweeps.calls == ["freeze", "thaw"]
    await freezer.thawed_for_agent()
    assert sweeps.calls == ["freeze", "thaw"]
