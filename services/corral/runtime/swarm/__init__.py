"""The Docker Swarm driver of :class:`~corral.runtime.SandboxRuntime` (``CORRAL_RUNTIME=swarm``):
talks to a swarm manager through the Docker API (``DOCKER_HOST``). A session's sandbox and its proxy
are each a service of one task, placed by Swarm across the nodes, on an internal overlay of the
session's own that the gateway's container joins; proxies reach upstreams through an attachable
egress overlay. Nothing is shared on a host: the controller's secret and a proxy's seed are Swarm
secrets (docs/design/0413-swarm-driver.md).

One module per concern, each a part of :class:`SwarmRuntime`: :mod:`.engine` (the client, options,
the readings of tasks and nodes), :mod:`.secrets`, :mod:`.networks`, :mod:`.sandboxes`,
:mod:`.egress` and :mod:`.refusals` (what a swarm cannot do here, refused by name)."""

from __future__ import annotations

from corral.runtime.swarm.egress import SwarmEgress
from corral.runtime.swarm.engine import DRIVER
from corral.runtime.swarm.refusals import SwarmRefusals
from corral.runtime.types import SwarmOptions

__all__ = ["DRIVER", "SwarmOptions", "SwarmRuntime"]


class SwarmRuntime(SwarmEgress, SwarmRefusals):
    """The swarm driver: services for sandboxes and proxies, overlays for sessions, Swarm secrets
    for what a task is given. Its parts share one client of the manager (:class:`.engine.SwarmEngine`)."""
