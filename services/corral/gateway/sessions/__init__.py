"""The session side of the gateway: :class:`SessionManager` (``manager``), what routes ask, and the
parts it is made of, one job each: the live sessions and their records (``book``, ``records``),
claims and cold starts (``claims``, ``starts``), the warm pool (``pool``), the reaper and liveness
(``reaper``, ``liveness``), ends and recovery (``endings``, ``recovery``), secrets and policy
changes (``brokering``), pause and resume (``pausing``, ``savedstate``, ``pausedstate``), the
recording wiring (``sessionrecordings``), the controllers' client (``controllers``) and what the
session side asks of egress (``egressport``).
Wired by corral.gateway.app's ``build_sessions``."""

from corral.gateway.sessions.manager import SessionManager, SessionParts
from corral.gateway.sessions.records import (
    GATEWAY_LABEL,
    KIND_LABEL,
    NODE_DRAINED_REASON,
    NODE_LOST_REASON,
    SANDBOX_EXITED,
    Listing,
    Pair,
    Session,
    SessionRecord,
    describe_exit,
    end_reason_of,
    new_session_id,
)

__all__ = [
    "GATEWAY_LABEL",
    "KIND_LABEL",
    "NODE_DRAINED_REASON",
    "NODE_LOST_REASON",
    "SANDBOX_EXITED",
    "Listing",
    "Pair",
    "Session",
    "SessionManager",
    "SessionParts",
    "SessionRecord",
    "describe_exit",
    "end_reason_of",
    "new_session_id",
]
