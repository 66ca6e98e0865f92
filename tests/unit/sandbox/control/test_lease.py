"""The control lease (corral.sandbox.control.lease): holders, hand-backs, waits, help requests, listeners."""

from __future__ import annotations

import asyncio

import pytest

from corral.contracts.actors import AGENT
from corral.errors import ControlTaken, ErrorCode
from corral.sandbox.control.lease import MAX_UNREAD, Change, ControlLease


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def lease_with_log() -> tuple[ControlLease, list[Change]]:
    lease = ControlLease(Clock())
    changes: list[Change] = []
    lease.subscribe(changes.append)
    return lease, changes


def test_the_agent_holds_it_at_first() -> None:
    lease = ControlLease(Clock())
    assert lease.holder.who == AGENT
    assert lease.refusal() is None
    lease.check()


def test_a_human_takes_it_and_the_agent_is_refused_naming_the_holder() -> None:
    lease, changes = lease_with_log()
    held = lease.take("human:lnk_a")
    refused = lease.refusal()
    assert isinstance(refused, ControlTaken)
    assert refused.code == ErrorCode.CONTROL_TAKEN
    assert refused.to_dict()["holder"] == "human:lnk_a"
    assert refused.to_dict()["since"] == held.since
    with pytest.raises(ControlTaken):
        lease.check()
    assert [c.kind for c in changes] == ["taken"]
    assert changes[0].previous == AGENT
    assert changes[0].as_event() == {"event": "control", "change": "taken", "holder": "human:lnk_a", "previous": AGENT}


def test_a_hand_back_reaches_the_agent_once() -> None:
    lease, changes = lease_with_log()
    lease.take("human:lnk_a")
    assert lease.take_hand_back() is None  # the agent does not hold it yet
    handed = lease.release("human:lnk_a", "logged in; go on")
    assert handed is not None and handed.note == "logged in; go on" and not handed.left
    assert lease.holder.who == AGENT
    assert lease.take_hand_back() == handed
    assert lease.take_hand_back() is None
    assert changes[-1].kind == "returned" and changes[-1].note == "logged in; go on"


def test_release_by_someone_who_does_not_hold_it_changes_nothing() -> None:
    lease, changes = lease_with_log()
    lease.take("human:lnk_a")
    assert lease.release("human:lnk_b", "x") is None
    assert lease.release(AGENT) is None
    assert lease.holder.who == "human:lnk_a"
    assert len(changes) == 1


def test_an_exclusive_cdp_client_takes_it_from_the_agent_only() -> None:
    lease = ControlLease(Clock())
    lease.take("cdp:cdp_1")
    with pytest.raises(ControlTaken) as refused:
        lease.take("cdp:cdp_2")
    assert refused.value.holder == "cdp:cdp_1"
    lease.take("human:lnk_a")  # a human takes it from anyone
    with pytest.raises(ControlTaken):
        lease.take("cdp:cdp_2")


def test_a_human_hands_back_to_the_cdp_client_it_took_from_while_attached() -> None:
    lease = ControlLease(Clock())
    lease.take("cdp:cdp_1")
    lease.take("human:lnk_a")
    lease.release("human:lnk_a", "done")
    assert lease.holder.who == "cdp:cdp_1"
    assert lease.take_hand_back() is None  # not the agent's yet
    lease.detach("cdp:cdp_1")
    assert lease.holder.who == AGENT
    handed = lease.take_hand_back()
    assert handed is not None and handed.by == "human:lnk_a"


def test_a_holder_that_left_in_between_is_skipped() -> None:
    lease = ControlLease(Clock())
    lease.take("cdp:cdp_1")
    lease.take("human:lnk_a")
    lease.detach("cdp:cdp_1")  # closed while the human held the lease
    lease.release("human:lnk_a")
    assert lease.holder.who == AGENT


def test_a_human_who_leaves_while_holding_gives_it_back_marked_left() -> None:
    lease, changes = lease_with_log()
    lease.take("human:lnk_a")
    handed = lease.detach("human:lnk_a")
    assert handed is not None and handed.left and handed.note is None
    assert lease.holder.who == AGENT
    assert changes[-1].kind == "left"


def test_taking_again_is_no_change() -> None:
    lease, changes = lease_with_log()
    first = lease.take("human:lnk_a")
    assert lease.take("human:lnk_a") == first
    assert len(changes) == 1


def test_help_requests_show_and_end_with_a_human_hand_back() -> None:
    lease, changes = lease_with_log()
    request = lease.request_help("solve the CAPTCHA")
    assert lease.state().view().wire()["help"] == {"reason": "solve the CAPTCHA", "at": request.at}
    lease.take("human:lnk_a")
    assert lease.state().help == request  # still shown while the human works
    lease.release("human:lnk_a", "solved")
    assert lease.state().help is None
    assert [c.kind for c in changes] == ["requested", "taken", "returned", "request_ended"]
    assert changes[0].reason == "solve the CAPTCHA"


def test_end_help_without_a_hand_back() -> None:
    lease, changes = lease_with_log()
    lease.request_help("stuck")
    lease.end_help()
    lease.end_help()
    assert lease.state().help is None
    assert [c.kind for c in changes] == ["requested", "request_ended"]


async def test_agent_may_act_waits_for_the_hand_back() -> None:
    lease = ControlLease(Clock())
    lease.take("human:lnk_a")
    waiting = asyncio.create_task(lease.agent_may_act(5_000))
    await asyncio.sleep(0)
    assert not waiting.done()
    lease.release("human:lnk_a", "yours")
    await asyncio.wait_for(waiting, 1)


async def test_agent_may_act_gives_up_after_its_wait() -> None:
    lease = ControlLease(Clock())
    lease.take("human:lnk_a")
    with pytest.raises(ControlTaken):
        await lease.agent_may_act(1)
    with pytest.raises(ControlTaken):
        await lease.agent_may_act(0)


async def test_wait_for_hand_back_returns_the_note() -> None:
    lease = ControlLease(Clock())
    lease.request_help("log in please")
    waiting = asyncio.create_task(lease.wait_for_hand_back(5_000))
    await asyncio.sleep(0)
    lease.take("human:lnk_a")
    await asyncio.sleep(0)
    assert not waiting.done()
    lease.release("human:lnk_a", "logged in")
    handed = await asyncio.wait_for(waiting, 1)
    assert handed is not None and handed.note == "logged in"
    assert lease.take_hand_back() is None  # consumed


async def test_wait_for_hand_back_times_out_with_none() -> None:
    lease = ControlLease(Clock())
    assert await lease.wait_for_hand_back(1) is None


async def test_wait_for_return() -> None:
    lease = ControlLease(Clock())
    assert await lease.wait_for_return(0)
    lease.take("cdp:cdp_1")
    assert not await lease.wait_for_return(1)
    waiting = asyncio.create_task(lease.wait_for_return(5_000))
    await asyncio.sleep(0)
    lease.detach("cdp:cdp_1")
    assert await asyncio.wait_for(waiting, 1)


def test_unsubscribe() -> None:
    lease, changes = lease_with_log()
    seen: list[Change] = []
    unsubscribe = lease.subscribe(seen.append)
    lease.take("human:lnk_a")
    unsubscribe()
    lease.release("human:lnk_a")
    assert len(seen) == 1 and len(changes) == 2


def test_every_unread_hand_back_reaches_the_agent_in_order() -> None:
    lease, _ = lease_with_log()
    lease.take("human:a")
    lease.release("human:a", "from A")
    lease.take("human:b")
    lease.release("human:b", "from B")
    first, second = lease.take_hand_back(), lease.take_hand_back()
    assert first is not None and (first.by, first.note) == ("human:a", "from A")
    assert second is not None and (second.by, second.note) == ("human:b", "from B")
    assert lease.take_hand_back() is None


def test_unread_hand_backs_are_bounded_oldest_dropped() -> None:
    lease, _ = lease_with_log()
    for n in range(MAX_UNREAD + 3):
        lease.take("human:a")
        lease.release("human:a", str(n))
    notes = []
    while (handed := lease.take_hand_back()) is not None:
        notes.append(handed.note)
    assert notes == [str(n) for n in range(3, MAX_UNREAD + 3)]


async def test_wait_for_hand_back_ignores_an_older_unread_one() -> None:
    lease, _ = lease_with_log()
    lease.take("human:a")
    lease.release("human:a", "old")
    assert await lease.wait_for_hand_back(1) is None  # "old" came before the wait
    handed = lease.take_hand_back()
    assert handed is not None and handed.note == "old"  # still the agent's to read


async def test_wait_for_hand_back_wakes_on_the_release_even_when_another_reply_read_it() -> None:
    lease, _ = lease_with_log()
    since = lease.hand_backs
    lease.take("human:a")
    waiting = asyncio.create_task(lease.wait_for_hand_back(600_000, since))
    await asyncio.sleep(0)
    lease.release("human:a", "done")
    read_elsewhere = lease.take_hand_back()  # a concurrent request's reply, before the waiter runs
    handed = await asyncio.wait_for(waiting, 5)
    assert read_elsewhere is not None and handed == read_elsewhere
    assert lease.take_hand_back() is None


def test_detaching_the_agent_changes_nothing() -> None:
    lease, _ = lease_with_log()
    lease.attach("human:a")
    lease.detach(AGENT)
    lease.take("human:a")
    lease.release("human:a")
    assert lease.holder.who == AGENT
    lease.take("human:a")
    lease.detach("human:a")
    assert lease.holder.who == AGENT


async def test_a_listener_that_raises_neither_stops_the_others_nor_the_waiters() -> None:
    lease = ControlLease(Clock())

    def broken(change: Change) -> None:
        raise RuntimeError("listener bug")

    changes: list[Change] = []
    lease.subscribe(broken)
    lease.subscribe(changes.append)
    lease.take("human:a")
    waiting = asyncio.create_task(lease.agent_may_act(600_000))
    await asyncio.sleep(0)
    lease.release("human:a")
    await asyncio.wait_for(waiting, 5)
    assert [c.kind for c in changes] == ["taken", "returned"]


async def test_no_human_returns_once_the_persons_turn_ends_and_not_for_a_cdp_client() -> None:
    lease = ControlLease()
    await lease.no_human()  # the agent holds it: at once
    lease.take("cdp:c1")
    await lease.no_human()  # an exclusive CDP client is the agent's: its processes are not frozen
    lease.release("cdp:c1")
    lease.take("human:lnk_a")
    waiting = asyncio.create_task(lease.no_human())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    lease.release("human:lnk_a")
    await asyncio.wait_for(waiting, 1)
