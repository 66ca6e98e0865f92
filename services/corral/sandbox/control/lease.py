"""The session's control lease: who may drive the desktop and the browser right now.

One lease per sandbox, held by the agent (``agent``) from the start. A human with a control link
(``human:<link id>``) takes it from anyone; a CDP connection opened as exclusive (``cdp:<conn id>``)
takes it only from the agent. While someone else holds it the agent's actions are refused with
:class:`~corral.errors.ControlTaken` (or wait for it, up to the request's ``wait_for_control_ms``).
A human hands back with an optional note, which the agent gets once (:meth:`ControlLease.take_hand_back`:
the next reply carries it, or the ``control`` action returns it). Hand-backs not yet read wait in the
order they were made (up to :data:`MAX_UNREAD`, the oldest dropped first): each reply carries the
oldest, so two humans' notes both reach the agent.

Holders stack: a human who takes the lease from an exclusive CDP connection gives it back to that
connection if it is still attached, else to the agent. A holder that goes away (its stream or
connection closed) is :meth:`detach`-ed: as a release without a note, marked ``left``.

Pure state and asyncio waits; no I/O. Listeners (live streams, the recorder, the audit) are called
synchronously with each :class:`Change`, in the order they subscribed; a listener must not raise
(what it must do at length it schedules); one that does is logged, and the others and the waiters
still hear of the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

from corral.contracts.actors import AGENT, is_human
from corral.errors import ControlTaken
from corral.protocol import results as r

log = logging.getLogger(__name__)

# Hand-backs kept for the agent until read; a flood of take/release from links drops the oldest.
MAX_UNREAD = 16

ChangeKind = Literal["taken", "returned", "left", "requested", "request_ended"]
Listener = Callable[["Change"], None]


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the lease and since when (unix seconds)."""

    who: str
    since: float


@dataclass(frozen=True, slots=True)
class HandBack:
    """A human's (or a departed holder's) return of the lease, for the agent: once."""

    by: str
    note: str | None
    at: float
    left: bool = False  # the holder went away (its stream closed) rather than handing back

    def result(self) -> r.HandBack:
        return r.HandBack(by=self.by, note=self.note, at=self.at, left=self.left)


@dataclass(frozen=True, slots=True)
class HelpRequest:
    """The agent's ``request_control``: a banner in every viewer until a human hands back."""

    reason: str
    at: float

    def result(self) -> r.HelpRequest:
        return r.HelpRequest(reason=self.reason, at=self.at)


@dataclass(frozen=True, slots=True)
class LeaseState:
    holder: Holder
    help: HelpRequest | None

    def view(self) -> r.LeaseView:
        """The ``lease`` member of live-stream messages."""
        return r.LeaseView(holder=self.holder.who, since=self.holder.since, help=self._help())

    def answer(self, handed: HandBack | None) -> r.LeaseAnswer:
        """The ``control`` action's result: the lease, and the hand-back ``handed`` (if any)."""
        handed_back = None if handed is None else handed.result()
        return r.LeaseAnswer(
            holder=self.holder.who, since=self.holder.since, help=self._help(), handed_back=handed_back
        )

    def _help(self) -> r.HelpRequest | None:
        return None if self.help is None else self.help.result()


class ControlEvent(TypedDict):
    """A change of the lease as the recording keeps it (a ``note`` or ``reason`` only when it has one)."""

    event: Literal["control"]
    change: ChangeKind
    holder: str
    previous: str
    note: NotRequired[str]
    reason: NotRequired[str]


@dataclass(frozen=True, slots=True)
class Change:
    """One change of the lease, as listeners get it."""

    kind: ChangeKind
    state: LeaseState
    previous: str  # the holder before (for requests: the holder at the time)
    note: str | None = None  # a hand-back's note
    reason: str | None = None  # a help request's reason

    def as_event(self) -> ControlEvent:
        """The recording's ``control`` event (corral.sandbox.recorder) for this change."""
        out = ControlEvent(event="control", change=self.kind, holder=self.state.holder.who, previous=self.previous)
        if self.note is not None:
            out["note"] = self.note
        if self.reason is not None:
            out["reason"] = self.reason
        return out


class ControlLease:
    """See the module's docstring. ``clock`` gives unix seconds (a fake one in tests)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        # The holders in the order they took the lease; the last one holds it. The agent is never
        # popped: it is the bottom of every stack.
        self._stack: list[Holder] = [Holder(AGENT, clock())]
        self._attached: set[str] = {AGENT}
        self._help: HelpRequest | None = None
        # Hand-backs the agent has not read, oldest first, and the recent ones numbered (counted by
        # ``_handed``) so a help request knows which came after it.
        self._unread: deque[HandBack] = deque(maxlen=MAX_UNREAD)
        self._recent: deque[tuple[int, HandBack]] = deque(maxlen=MAX_UNREAD)
        self._handed = 0
        # Set and replaced at each change: waiters wake, look again, and wait on the new one.
        self._changed = asyncio.Event()
        self._listeners: list[Listener] = []

    # -- reading

    @property
    def holder(self) -> Holder:
        return self._stack[-1]

    def state(self) -> LeaseState:
        return LeaseState(self.holder, self._help)

    def held_by(self, who: str) -> bool:
        return self.holder.who == who

    def refusal(self, who: str = AGENT) -> ControlTaken | None:
        """The error for ``who`` acting now, or None when ``who`` holds the lease."""
        holder = self.holder
        if holder.who == who:
            return None
        return ControlTaken(holder.who, holder.since)

    def check(self, who: str = AGENT) -> None:
        """Raises :class:`ControlTaken` unless ``who`` holds the lease."""
        refused = self.refusal(who)
        if refused is not None:
            raise refused

    # -- listeners

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Calls ``listener`` with every :class:`Change` from now on; returns the unsubscribe."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    # -- holders

    def attach(self, who: str) -> None:
        """``who`` is present (a live stream in control mode, a CDP connection): a lease handed back
        may go to it."""
        self._attached.add(who)

    def take(self, who: str) -> Holder:
        """``who`` takes the lease: a human from anyone, an exclusive CDP connection from the agent
        only (:class:`ControlTaken` otherwise). Taking what one holds changes nothing."""
        current = self.holder
        if current.who == who:
            return current
        if not is_human(who) and current.who != AGENT:
            raise ControlTaken(current.who, current.since)
        self._attached.add(who)
        self._stack = [h for h in self._stack if h.who != who]
        self._stack.append(Holder(who, self._clock()))
        self._emit("taken", current.who)
        return self.holder

    def release(self, who: str, note: str | None = None) -> HandBack | None:
        """``who`` gives the lease back (to whom it took it from, if still attached, else the agent).
        A human's release leaves the agent a :class:`HandBack`, and ends a help request. None when
        ``who`` did not hold it (nothing changes)."""
        return self._give_back(who, note, left=False)

    def detach(self, who: str) -> HandBack | None:
        """``who`` went away: released if it held the lease (``left``), and forgotten either way. The
        agent never goes away: it stays the bottom of every stack."""
        if who == AGENT:
            return None
        self._attached.discard(who)
        handed = self._give_back(who, None, left=True)
        self._stack = [h for h in self._stack if h.who != who]
        return handed

    def _give_back(self, who: str, note: str | None, *, left: bool) -> HandBack | None:
        if who == AGENT or self.holder.who != who:
            return None
        self._stack.pop()
        # Whoever it was taken from, if still here; the agent at the bottom always is.
        while self._stack[-1].who not in self._attached:
            self._stack.pop()
        now = self._clock()
        top = self._stack[-1]
        self._stack[-1] = Holder(top.who, now)
        handed: HandBack | None = None
        if is_human(who):
            handed = HandBack(who, note, now, left)
            self._handed += 1
            self._unread.append(handed)
            self._recent.append((self._handed, handed))
        helped = self._help is not None and is_human(who) and top.who == AGENT
        self._emit("left" if left else "returned", who, note=note)
        if helped:
            self._help = None
            self._emit("request_ended", who)
        return handed

    # -- the agent's side

    @property
    def hand_backs(self) -> int:
        """How many hand-backs humans have made so far (what :meth:`wait_for_hand_back` counts from)."""
        return self._handed

    def take_hand_back(self) -> HandBack | None:
        """The oldest hand-back the agent has not read, once (None when there is none or the agent
        does not hold the lease)."""
        if self.holder.who != AGENT or not self._unread:
            return None
        return self._unread.popleft()

    async def agent_may_act(self, wait_ms: int = 0) -> None:
        """Returns once the agent holds the lease; raises :class:`ControlTaken` if it does not within
        ``wait_ms``."""
        if self.holder.who == AGENT:
            return
        if wait_ms > 0:
            await self._wait_until(lambda: self.holder.who == AGENT, wait_ms)
        self.check(AGENT)

    async def wait_for_return(self, wait_ms: int) -> bool:
        """Waits up to ``wait_ms`` while someone else holds the lease; whether the agent holds it."""
        if self.holder.who != AGENT and wait_ms > 0:
            await self._wait_until(lambda: self.holder.who == AGENT, wait_ms)
        return self.holder.who == AGENT

    async def no_human(self) -> None:
        """Returns once no person holds the lease (the agent's processes are thawed then)."""
        while is_human(self.holder.who):
            await self._wait_until(lambda: not is_human(self.holder.who), 3_600_000)

    def request_help(self, reason: str) -> HelpRequest:
        """The agent asks a human to step in (the viewers show ``reason``)."""
        self._help = HelpRequest(reason, self._clock())
        self._emit("requested", self.holder.who, reason=reason)
        return self._help

    def end_help(self) -> None:
        """The agent's help request ends without a hand-back (it stopped waiting)."""
        if self._help is not None:
            self._help = None
            self._emit("request_ended", self.holder.who)

    async def wait_for_hand_back(self, wait_ms: int, since: int | None = None) -> HandBack | None:
        """Waits up to ``wait_ms`` for a human to hand the lease back to the agent after the first
        ``since`` hand-backs (:attr:`hand_backs` when the agent asked; default: now); the first such,
        taken from the unread ones (returned even when another reply read it meanwhile: it came for
        this wait). An older unread hand-back does not end the wait."""
        if since is None:
            since = self._handed
        await self._wait_until(lambda: self._handed > since and self.holder.who == AGENT, wait_ms)
        if self.holder.who != AGENT:
            return None
        for number, handed in self._recent:
            if number > since:
                with contextlib.suppress(ValueError):
                    self._unread.remove(handed)
                return handed
        return None  # more than MAX_UNREAD hand-backs since: the oldest are gone

    # -- plumbing

    async def _wait_until(self, ready: Callable[[], bool], wait_ms: int) -> None:
        try:
            async with asyncio.timeout(wait_ms / 1000):
                while not ready():
                    await self._changed.wait()
        except TimeoutError:
            pass

    def _emit(self, kind: ChangeKind, previous: str, *, note: str | None = None, reason: str | None = None) -> None:
        change = Change(kind, self.state(), previous, note, reason)
        try:
            for listener in list(self._listeners):
                try:
                    listener(change)
                except Exception:
                    log.exception("a listener of the control lease failed on %s", kind)
        finally:
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
