"""What the gateway knows of a session: its record (stored), the live session, and the sandbox pair
a session is made of; the labels that mark what this gateway instance started."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, Field

from corral.gateway.egress import Egress, Ground
from corral.gateway.links import LinkRecord
from corral.gateway.models import Resources, SessionTerms
from corral.gateway.previews.book import PreviewRecord
from corral.gateway.secrets import SecretRecord
from corral.gateway.sessions.pausedstate import PausedState
from corral.runtime import NODE_DRAINED, NODE_LOST, ExitInfo, SandboxAddress, State

KIND_LABEL = "corral.kind"
GATEWAY_LABEL = "corral.gateway"
SANDBOX_EXITED = "sandbox_exited"  # the end reason of a session whose sandbox died under it
# ... whose sandbox's machine went down or was cut off, or was drained (a multi-node runtime's).
NODE_LOST_REASON = "node_lost"
NODE_DRAINED_REASON = "node_drained"
# The end reasons of a session whose sandbox is gone or out of reach: nothing to save from it at its end.
SANDBOX_GONE_REASONS = frozenset({SANDBOX_EXITED, NODE_LOST_REASON, NODE_DRAINED_REASON})
PAUSE_STATES = frozenset({"pausing", "paused", "resuming"})
CLOSE_PAUSED = 4009  # a WebSocket closed because its session paused (4000: it ended)


def new_session_id() -> str:
    return "ses_" + secrets.token_hex(8)


def end_reason_of(info: ExitInfo) -> str:
    """The end reason of a session whose sandbox ended as ``info`` says."""
    if info.state == NODE_LOST:
        return NODE_LOST_REASON
    if info.state == NODE_DRAINED:
        return NODE_DRAINED_REASON
    return SANDBOX_EXITED


def describe_exit(info: ExitInfo) -> str:
    """What ended a sandbox, in words (the WebSocket close reason and the log carry it)."""
    node = info.node or "its node"
    if info.state == NODE_LOST:
        return f"{node} is down or cut off from the cluster"
    if info.state == NODE_DRAINED:
        return f"{node} was drained: its sandboxes were stopped"
    if info.state == "gone":
        return "its container was removed"
    code = f"exit code {info.exit_code}" if info.exit_code is not None else f"state {info.state}"
    return f"out of memory (OOM-killed), {code}" if info.oom_killed else code


@dataclass(frozen=True, slots=True)
class Listing:
    """A reaper tick's one listing of the instance's proxies (session id -> state), and the live
    sessions with egress it was made for (a session started after it may be missing from it)."""

    watched: frozenset[str]
    proxies: Mapping[str, State]
    grounds: tuple[Ground, ...] = ()  # held grounds with a proxy, snapshot before the listing
    taken_at: float = field(default_factory=time.monotonic)  # by the reaper's clock when it makes one


@dataclass(frozen=True, slots=True)
class Pair:
    """A started sandbox and its egress (None when egress control is off), before or after a claim."""

    session_id: str
    sandbox: SandboxAddress
    egress: Egress | None


# The record's fields that a session without them leaves out of its file, one per line (each part adds its own).
_OPTIONAL = (
    "secrets",
    "links",
    "previews",
    "env",
    "env_values",
    "volume",
    "template",
    "profile",
    "resources",
    "paused",
    "paused_at",
)


class SessionRecord(SessionTerms):
    """What the gateway keeps about a session, one JSON file each in its data dir (corral.gateway.store):
    with Docker's list of live sandboxes, what a restarted gateway adopts sessions from. Frozen: a
    change (a new policy, a revived proxy) replaces it whole, and the file with it."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    container: str  # the sandbox's id
    owner: str
    token_sha256: str
    egress: Egress | None = None
    # Its brokered secrets' placeholders and bindings (corral.gateway.secrets); their values never.
    secrets: dict[str, SecretRecord] = Field(default_factory=dict)
    # Its viewer links (corral.gateway.links), by id: their secrets' SHA-256 only.
    links: dict[str, LinkRecord] = Field(default_factory=dict)
    # Its port previews (corral.gateway.previews), by id: their secrets' SHA-256 only.
    previews: dict[str, PreviewRecord] = Field(default_factory=dict)
    # Its environment variables' values (``env`` holds their names): not secrets (the agent reads them),
    # kept here, 0600 in the gateway's data dir, so that a controller restarted after a gateway
    # restart gets them back (corral.gateway.sessions.envs). Never in an answer or a recording.
    env_values: dict[str, str] = Field(default_factory=dict, repr=False)
    resources: Resources | None = None  # as asked at create: a resumed sandbox gets the same
    # While paused: what was saved of it (corral.gateway.sessions.savedstate); None while it runs.
    paused: PausedState | None = None

    def to_json(self) -> dict[str, Any]:
        # A session without these is written as before they existed (an older gateway reads it alike).
        unset = {name for name in _OPTIONAL if not getattr(self, name)}
        if self.idle_action == "end":  # the default, as a record before pause and resume was written
            unset.add("idle_action")
        return self.model_dump(mode="json", exclude=unset or None)


@dataclass
class Session:
    """A live session: its record and what only a live session has (its sandbox's address, activity, state)."""

    record: SessionRecord
    sandbox: SandboxAddress
    last_activity_at: float = field(default_factory=time.time)
    state: str = "ready"
    in_flight: int = 0  # HTTP actions under way: a long one is activity, not idleness
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    removed: asyncio.Event = field(default_factory=asyncio.Event)  # its sandbox and record are gone: its slot is free
    # A stable code: deleted, timeout, idle_timeout, sandbox_exited, node_lost, node_drained,
    # controller_dead, egress_proxy_gone.
    end_reason: str = ""
    end_detail: str = ""  # what the code alone does not say (a dead sandbox: OOM-killed, its exit code)
    changing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one PATCH at a time: each sees the last

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def owner(self) -> str:
        return self.record.owner

    @property
    def egress(self) -> Egress | None:
        return self.record.egress

    @egress.setter
    def egress(self, egress: Egress | None) -> None:
        self.record = self.record.model_copy(update={"egress": egress})

    def touch(self) -> None:
        self.last_activity_at = time.time()

    @property
    def paused(self) -> bool:
        """Without a sandbox (pausing, paused, resuming): nothing may reach it (SessionPaused)."""
        return self.state in PAUSE_STATES

    def close_code(self) -> int:
        """The code its WebSockets are closed with: 4000 when it ends, CLOSE_PAUSED when it pauses."""
        return CLOSE_PAUSED if self.paused else 4000

    def close_reason(self) -> str:
        """The reason its WebSockets are closed with; at most 123 bytes, as RFC 6455 allows."""
        if self.paused:
            return "session paused: resume it with POST /v1/sessions/{id}/resume"
        text = f"session ended: {self.end_reason}" + (f" ({self.end_detail})" if self.end_detail else "")
        return text.encode()[:123].decode(errors="ignore")
