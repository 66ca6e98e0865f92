"""The agent's side of the lease: what ``control`` and ``request_control`` answer and wait for, and
each change recorded and sent to the audit without blocking the lease."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.sandbox.control import takeover
from corral.sandbox.control.lease import Change, ControlLease

HUMAN = "human:lnk_3kq9x0a1b2c4"
AT = 50.0


def _lease() -> tuple[ControlLease, list[Change]]:
    lease = ControlLease(clock=lambda: AT)
    changes: list[Change] = []
    lease.subscribe(changes.append)
    return lease, changes


async def test_control_answers_the_lease_at_once_while_the_agent_holds_it() -> None:
    lease, _ = _lease()
    assert (await takeover.control(lease, 600_000)).wire() == {
        "holder": "agent",
        "since": AT,
        "help": None,
        "handed_back": None,
    }


async def test_control_returns_a_waiting_hand_back_once() -> None:
    lease, _ = _lease()
    lease.take(HUMAN)
    lease.release(HUMAN, "the 2FA code was 4411")
    first = (await takeover.control(lease, 0)).wire()
    assert first["handed_back"] == {"by": HUMAN, "note": "the 2FA code was 4411", "at": AT, "left": False}
    assert (await takeover.control(lease, 0)).wire()["handed_back"] is None
    assert lease.take_hand_back() is None


async def test_control_while_a_human_holds_it_answers_the_holder_when_the_wait_runs_out() -> None:
    lease, _ = _lease()
    lease.take(HUMAN)
    answer = (await takeover.control(lease, 1)).wire()
    assert answer == {"holder": HUMAN, "since": AT, "help": None, "handed_back": None}


async def test_request_control_shows_the_reason_and_returns_the_humans_note() -> None:
    lease, changes = _lease()

    def step_in(change: Change) -> None:  # a human answers the banner
        if change.kind == "requested":
            assert change.state.help is not None and change.state.help.reason == "solve the CAPTCHA"
            asyncio.get_running_loop().call_soon(lease.take, HUMAN)
        elif change.kind == "taken":
            asyncio.get_running_loop().call_soon(lease.release, HUMAN, "solved")

    lease.subscribe(step_in)
    answer = (await takeover.request_control(lease, "solve the CAPTCHA", 600_000)).wire()
    assert answer == {
        "holder": "agent",
        "since": AT,
        "help": None,
        "handed_back": {"by": HUMAN, "note": "solved", "at": AT, "left": False},
    }
    assert [c.kind for c in changes] == ["requested", "taken", "returned", "request_ended"]
    assert lease.take_hand_back() is None  # consumed


async def test_request_control_that_nobody_answers_ends_the_request_without_an_error() -> None:
    lease, changes = _lease()
    answer = (await takeover.request_control(lease, "approve the payment", 1)).wire()
    assert answer == {"holder": "agent", "since": AT, "help": None, "handed_back": None}
    assert [c.kind for c in changes] == ["requested", "request_ended"]


async def test_a_cancelled_request_control_ends_the_request() -> None:
    lease, changes = _lease()
    asking = asyncio.create_task(takeover.request_control(lease, "log in", 600_000))
    await asyncio.sleep(0)  # one turn: it asked and waits
    assert lease.state().help is not None
    asking.cancel()
    await asyncio.gather(asking, return_exceptions=True)
    assert lease.state().help is None and [c.kind for c in changes] == ["requested", "request_ended"]


class Notes:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def note(self, event: dict[str, Any]) -> None:
        self.events.append(event)


class Reporter:
    """Sends only when let through: the lease's listener must not wait for it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []
        self.go = asyncio.Event()

    async def lease_changed(self, change: str, holder: str, previous: str) -> None:
        await self.go.wait()
        self.sent.append((change, holder, previous))


async def test_the_lease_log_records_each_change_and_sends_it_to_the_audit_in_order() -> None:
    lease, _ = _lease()
    notes, reporter = Notes(), Reporter()
    log = takeover.LeaseLog(lease, notes, reporter)  # type: ignore[arg-type]
    lease.take(HUMAN)
    lease.release(HUMAN, "done")
    assert notes.events == [
        {"event": "control", "change": "taken", "holder": HUMAN, "previous": "agent"},
        {"event": "control", "change": "returned", "holder": "agent", "previous": HUMAN, "note": "done"},
    ]
    assert reporter.sent == []  # the listener returned at once
    reporter.go.set()
    await log.close()
    assert reporter.sent == [("taken", HUMAN, "agent"), ("returned", "agent", HUMAN)]
    lease.take(HUMAN)
    assert len(notes.events) == 2  # unsubscribed


async def test_request_control_is_not_answered_by_an_older_unread_hand_back() -> None:
    lease, changes = _lease()
    lease.take(HUMAN)
    lease.release(HUMAN, "earlier")
    answer = (await takeover.request_control(lease, "approve the payment", 1)).wire()
    assert answer["handed_back"] is None
    assert answer["help"] is None and [c.kind for c in changes][-2:] == ["requested", "request_ended"]
    handed = lease.take_hand_back()
    assert handed is not None and handed.note == "earlier"


async def test_request_control_ends_the_request_when_the_human_hands_back_to_a_cdp_connection() -> None:
    lease, _ = _lease()
    lease.take("cdp:cdp_0a1b2c3d")
    lease.take(HUMAN)
    waiting = asyncio.create_task(takeover.request_control(lease, "look", 1))
    await asyncio.sleep(0)
    lease.release(HUMAN, "back to the script")
    answer = (await waiting).wire()
    assert answer["holder"] == "cdp:cdp_0a1b2c3d" and answer["handed_back"] is None
    assert lease.state().help is None
