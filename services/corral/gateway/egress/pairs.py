"""What the gateway knows of a session's egress pair, as plain values: the pair itself (:class:`Egress`,
kept in the session record), a ground made ahead (:class:`Ground`), a pair before its proxy starts
(:class:`Prepared`), a policy as set or reported (:class:`PolicyView`), and the constants the
pair's parts agree on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral.contracts.control import Reply
from corral.proxy.audit import AnchoredPolicy
from corral.proxy.control import AUDIT_FILE
from corral.proxy.policy import parse_rule
from corral.runtime import SessionNetwork, State

META_FILE = "session.json"
# <egress root>/.grounds/<session>: a ground's marker until a session takes it, holding the instance's
# name. Kept by the gateway alone, never in the ground's state directory: that one is mounted into the
# session's proxy, which could forge a marker there and have a restarted gateway delete a live
# session's audit log. Nothing mounts .grounds (the runtime mounts a proxy's state dir and the
# sandbox's <session>.sandbox dir only), and "ses_*" globs over the root never see it.
GROUNDS_DIR = ".grounds"
# A proxy started ahead starts here: enforce, nothing allowed, until its session's policy is set.
STRICTEST_MODE = "enforce"
PROXY_TOKEN_FILE = "proxy-token"  # in <session>.sandbox: the sandbox's copy of the controller token
# A ground held longer than this is dropped and made again rather than taken (its CA ages meanwhile).
GROUND_MAX_AGE_S = 24 * 3600.0
# A ground's CA must outlast the longest session by this much, beyond max_timeout_s.
GROUND_CA_MARGIN_S = 3600.0
# The key each session's proxy token is derived from (HMAC of the session id), so no record on disk
# holds a token: <data_dir>/egress-token.key, 0600 in the 0700 data dir.
TOKEN_KEY_FILE = "egress-token.key"
PROXY_MEMORY_MB = 512
REASSERT_ACTOR = "gateway:reassert"  # the actor of a policy the gateway sets again after a foreign change
POLL_TIMEOUT_S = 2.0
# A proxy in one of these (or gone) while the gateway waits for it to come up never will.
PROXY_FAILED_STATES: frozenset[State | None] = frozenset({"exited", "dead", "restarting", None})
# A proxy in one of these is left alone by the watchdog (up, or on its way up or out).
PROXY_BUSY_STATES: frozenset[State] = frozenset({"running", "restarting", "created", "removing"})


@dataclass(frozen=True, slots=True)
class Egress:
    """One session's egress pair, as kept in the session record (corral.gateway.sessions.SessionRecord
    serialises it): nothing secret in it, as the proxy's token is derived, never stored."""

    session_id: str
    network: str
    subnet: str
    gateway: str
    proxy_id: str
    proxy_name: str
    proxy_address: str
    state_dir: str

    @property
    def audit_path(self) -> Path:
        return Path(self.state_dir) / AUDIT_FILE


@dataclass(frozen=True, slots=True)
class PolicyView:
    """A proxy's policy as the control channel reports it (or as the gateway last set it)."""

    generation: int
    allow: tuple[str, ...]
    mode: str

    @classmethod
    def from_reply(cls, reply: Reply) -> PolicyView:
        return cls(reply.generation or 0, reply.allow or (), str(reply.mode))

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> PolicyView:
        """From the anchor that kept it (:meth:`record`)."""
        generation, allow = record.get("generation", 0), record.get("allow")
        listed = tuple(str(entry) for entry in allow) if isinstance(allow, list) else ()
        return cls(int(generation) if isinstance(generation, int | str) else 0, listed, str(record.get("mode")))

    def record(self) -> AnchoredPolicy:
        """As an anchor keeps it (corral.gateway.anchors)."""
        return {"generation": self.generation, "allow": list(self.allow), "mode": self.mode}


def canonical_allow(allow: list[str]) -> tuple[str, ...]:
    """The allowlist as the proxy reports it back (each entry in its canonical text)."""
    try:
        return tuple(str(parse_rule(entry)) for entry in allow)
    except ValueError:
        return tuple(allow)  # the proxy refuses it anyway; nothing to compare against


@dataclass(frozen=True, slots=True)
class Ground:
    """What a session's egress needs before its proxy can start and that no request decides: its
    network and its CA in its state directory (corral.gateway.grounds keeps a few made ahead)."""

    session_id: str
    network: SessionNetwork
    state_dir: Path
    ca_cert: str  # the CA's certificate (PEM), which the sandbox trusts; its key stays in state_dir
    made_at: float = 0.0  # time.time() when it was made
    ca_not_after: float = float("inf")  # when its CA expires
    # Its proxy, started ahead (CORRAL_GROUND_PROXIES) in enforce mode with nothing allowed, until a
    # session takes it and sets its policy; None when the proxy starts at the claim.
    egress: Egress | None = None
    # The proxy's controller token (in the proxy's environment and the sandbox's 0600 file; never logged).
    controller_token: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A session's network, state and CA, before its proxy starts (the sandbox can start meanwhile)."""

    session_id: str
    network: SessionNetwork
    state_dir: Path
    labels: dict[str, str]
    environment: dict[str, str]  # the proxy's (its token included: in the container, not on disk here)
    sandbox_env: dict[str, str]  # what the sandbox needs beside the proxy's place: its control port, the CA
    hermetic: bool
    # host path -> path in the sandbox, mounted read-only: the control channel's token, a file only the
    # sandbox's controller uid reads (an environment variable would reach every process's exec).
    sandbox_files: dict[str, str] = field(default_factory=dict)
    # Its proxy when the ground's was started ahead: running with nothing allowed, the session's policy
    # still to be set (EgressManager.set_start_policy) before the session's token is returned.
    egress: Egress | None = None
