"""The agent's side of the control lease (corral.sandbox.control.lease): the ``control`` and
``request_control`` actions' answers, and each change of the lease recorded and audited.

Both actions answer ``{"holder", "since", "help", "handed_back"}``: the lease as it is, and the
human's hand-back (its note) if one waits for the agent, consumed (the next reply does not repeat it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from corral.contracts.actors import AGENT
from corral.protocol import results as r
from corral.sandbox.control.lease import Change, ControlEvent, ControlLease, HandBack
from corral.sandbox.egress import ActionReporter

log = logging.getLogger(__name__)

# How long the controller's shutdown waits for audit calls still being sent.
CLOSE_WAIT_S = 2.0


def answer(lease: ControlLease, handed: HandBack | None) -> r.LeaseAnswer:
    """What ``control`` and ``request_control`` return."""
    return lease.state().answer(handed)


async def control(lease: ControlLease, wait_ms: int) -> r.LeaseAnswer:
    """The lease now; while someone else holds it, after waiting up to ``wait_ms`` for it to come back."""
    if not lease.held_by(AGENT):
        await lease.wait_for_return(wait_ms)
    return answer(lease, lease.take_hand_back())


async def request_control(lease: ControlLease, reason: str, wait_ms: int) -> r.LeaseAnswer:
    """Ask for a human (the viewers' banner shows ``reason``) and wait up to ``wait_ms`` for one to
    take the lease and hand it back. Nobody came: ``handed_back`` is None, not an error; the request
    ends either way (also when the agent's request is cancelled)."""
    since = lease.hand_backs  # only a hand-back made after the request answers it
    lease.request_help(reason)
    try:
        handed = await lease.wait_for_hand_back(wait_ms, since)
    finally:
        # Ended whatever happened: a hand-back to an exclusive CDP connection leaves it to the agent.
        lease.end_help()
    return answer(lease, handed)


class Notes(Protocol):
    """Where a non-action event goes (corral.sandbox.recorder.Recorder.note)."""

    def note(self, event: ControlEvent) -> None: ...


class LeaseLog:
    """Each change of the lease as a recording ``control`` event and an audit ``control`` record
    (through the proxy's control channel, no ack). A listener must not block: the audit call is a
    task, kept until it is sent."""

    def __init__(self, lease: ControlLease, recorder: Notes | None, reporter: ActionReporter | None) -> None:
        self._recorder = recorder
        self._reporter = reporter
        self._sending: set[asyncio.Task[None]] = set()
        self._unsubscribe = lease.subscribe(self._changed)

    def _changed(self, change: Change) -> None:
        if self._recorder is not None:
            self._recorder.note(change.as_event())
        if self._reporter is not None:
            # Sent in the order of the changes: the reporter's lock is FIFO, taken in creation order.
            sent = self._reporter.lease_changed(change.kind, change.state.holder.who, change.previous)
            task = asyncio.create_task(sent)
            self._sending.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("the audit did not get a change of the control lease: %s", task.exception())

    async def close(self) -> None:
        """Stop listening; what is still being sent gets a moment to go."""
        self._unsubscribe()
        if self._sending:
            await asyncio.wait(set(self._sending), timeout=CLOSE_WAIT_S)
        for task in set(self._sending):
            task.cancel()
