"""Each session's egress pair: :class:`EgressManager` (corral.gateway.egress.manager), what the session
side keeps of a pair (corral.gateway.egress.pairs), and the parts the manager composes."""

from corral.gateway.egress.manager import EgressManager
from corral.gateway.egress.pairs import PROXY_MEMORY_MB, REASSERT_ACTOR, Egress, Ground, PolicyView, Prepared

__all__ = ["PROXY_MEMORY_MB", "REASSERT_ACTOR", "Egress", "EgressManager", "Ground", "PolicyView", "Prepared"]
