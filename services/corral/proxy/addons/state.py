"""What the egress addons share, made once in :mod:`corral.proxy.load` and handed to each addon.

mitmproxy calls each hook on every addon in the order of load.py's list, one after the other, so
the addon that decides runs before the ones that act on its decision. What was decided about a
flow travels with it (:class:`FlowNote` in ``flow.metadata``); what outlives a flow is here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Unpack

from mitmproxy import http

from corral.proxy.attribution import Attribution, unvouched
from corral.proxy.audit import GENESIS, AuditLog, ChainHead, Event, EventFields
from corral.proxy.policy import Decision
from corral.proxy.responses import ResponseStore
from corral.proxy.secrets import SecretBook
from corral.proxy.vetting import LivePolicy, Verdict

__all__ = [
    "Actions",
    "Attribution",
    "Connections",
    "FlowNote",
    "Journal",
    "Replay",
    "Shared",
    "Tunnel",
    "Verdict",
    "attribution_of",
    "note_of",
]

NOTE = "corral"  # the key of a flow's FlowNote in flow.metadata
ATTRIBUTION = "corral.attribution"  # the key of the flow's Attribution, decided before its note
MAX_ACTIONS = 64


@dataclass(slots=True)
class Tunnel:
    """A client connection's CONNECT: where it goes, and what was decided about it."""

    host: str
    port: int
    verdict: Verdict
    ip: str | None
    generation: int  # of the policy that decided it; a policy change re-decides the tunnel


@dataclass(slots=True)
class FlowNote:
    """What the policy decided about a flow, for the addons after it (and its audit record)."""

    started: float
    attribution: Attribution  # the action that caused it, and who said so
    verdict: Verdict
    host: str  # the vetted name (mitmproxy's request.host may be the pinned address)
    ip: str | None = None  # the vetted address chosen for this flow (a CONNECT, or plain HTTP)
    logged: bool = False  # its audit record is written: a later hook writes none
    # Fields its record carries besides the exchange's (a secret's refusal: its name, where, why).
    extra: EventFields = field(default_factory=lambda: EventFields())

    def refuse(self, decision: Decision, status: int) -> None:
        self.verdict = Verdict(decision, "deny", status)


def note_of(flow: http.HTTPFlow) -> FlowNote | None:
    note = flow.metadata.get(NOTE)
    return note if isinstance(note, FlowNote) else None


def attribution_of(flow: http.HTTPFlow, shared: Shared) -> Attribution:
    """What :class:`~corral.proxy.addons.ActionAttribution` charged the flow to (what its client
    connection is charged to, had it not run)."""
    found = flow.metadata.get(ATTRIBUTION)
    return found if isinstance(found, Attribution) else shared.charged_to(flow.client_conn.id)


class Actions:
    """The actions in flight, in the order they started (the controller reports them), each with its
    actor when not the agent's (a human's input, a CDP connection's commands)."""

    def __init__(self) -> None:
        self._started: dict[str, tuple[float, str | None]] = {}

    def start(self, action: str, actor: str | None = None) -> None:
        if len(self._started) >= MAX_ACTIONS:
            self._started.pop(next(iter(self._started)))  # the oldest: a start whose end was lost
        self._started[action] = (time.time(), actor)

    def end(self, action: str) -> None:
        self._started.pop(action, None)

    def current(self) -> str | None:
        """The latest action in flight: the one a record names."""
        return next(reversed(self._started), None)

    def actor(self, action: str | None) -> str | None:
        """Who acts in ``action`` (None: the agent, or no such action in flight)."""
        started = self._started.get(action) if action is not None else None
        return started[1] if started is not None else None

    def ids(self) -> list[str]:
        return list(self._started)

    def in_flight(self) -> list[tuple[str, str | None]]:
        """Each action in flight with its actor, oldest first."""
        return [(action, actor) for action, (_, actor) in self._started.items()]


@dataclass(slots=True)
class Connections:
    """Per client connection: its tunnel, and the addresses vetted for it."""

    tunnels: dict[str, Tunnel] = field(default_factory=dict)  # client id -> its CONNECT
    commands: dict[str, Attribution] = field(default_factory=dict)  # client id -> the action its CONNECT named
    pins: dict[tuple[str, str, int], str] = field(default_factory=dict)  # (client id, address, port) -> name
    # Plain HTTP: (client id, name, port) -> the vetted address and its verdict, looked up once.
    resolved: dict[tuple[str, str, int], tuple[str | None, Verdict]] = field(default_factory=dict)

    def forget(self, client_id: str) -> None:
        self.tunnels.pop(client_id, None)
        self.commands.pop(client_id, None)
        for pin in [key for key in self.pins if key[0] == client_id]:
            del self.pins[pin]
        for lookup in [key for key in self.resolved if key[0] == client_id]:
            del self.resolved[lookup]


class Journal:
    """The session's audit log, once the audit addon opened it; records before that go nowhere."""

    def __init__(self) -> None:
        self.log: AuditLog | None = None

    def write(self, event: Event, **fields: Unpack[EventFields]) -> None:
        if self.log is not None:
            self.log.write(event, **fields)

    @property
    def head(self) -> ChainHead:
        """The chain's head, for the gateway to anchor: a tally due (past the log's budget) is
        written first, so the anchor covers the counts too."""
        if self.log is None:
            return {"seq": 0, "hash": GENESIS}
        self.log.flush_tally()
        return self.log.head

    def marks_after(self, seq: int, limit: int) -> list[ChainHead]:
        """The chain's marks (every few hundred records' seq and hash, from memory) past ``seq``."""
        return self.log.marks_after(seq, limit) if self.log is not None else []

    @property
    def records(self) -> int:
        return self.log.seq if self.log is not None else 0


@dataclass(slots=True)
class Replay:
    """A hermetic session's recorded responses: how many, or why there are none."""

    flows: int = 0
    error: str | None = "the recorded responses are not loaded"  # None once they are


@dataclass(slots=True, eq=False)
class Shared:
    """One per proxy: the policy, the actions, the connections, the journal, the recorded answers,
    the brokered secrets."""

    policy: LivePolicy = field(default_factory=LivePolicy)
    actions: Actions = field(default_factory=Actions)
    connections: Connections = field(default_factory=Connections)
    journal: Journal = field(default_factory=Journal)
    replay: Replay = field(default_factory=Replay)
    responses: ResponseStore | None = None  # upstream answers kept for hermetic replays
    secrets: SecretBook = field(default_factory=SecretBook)  # the brokered secrets (corral.proxy.secrets)
    # Who holds the control lease, as the controller last reported it ("agent" until it says otherwise).
    lease_holder: str = "agent"

    def charged_to(self, client_id: str) -> Attribution:
        """What a flow that names no action itself is charged to: the action its tunnel's CONNECT
        named, else the controller's latest action in flight that is not a human's (never a human's:
        corral.proxy.attribution.unvouched)."""
        named = self.connections.commands.get(client_id)
        if named is not None:
            return named
        return unvouched(self.actions.in_flight())
