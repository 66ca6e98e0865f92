"""The settings of the swarm driver (``CORRAL_RUNTIME=swarm``, docs/swarm.md): the gateway's own
container, placement, start timeout and encrypted overlays, handed to the runtime as
:class:`~corral.runtime.types.SwarmOptions`. A base of :class:`~corral.gateway.settings.GatewaySettings`,
read from ``CORRAL_*`` alike; apart only so that no class holds everything."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings


class SwarmSettings(BaseSettings):
    swarm_gateway_container: str = Field(
        default="",
        description=(
            "With `CORRAL_RUNTIME=swarm`: the container joined to each session's overlay, the one whose network "
            "namespace this gateway runs in (deploy/swarm/gateway.yaml: `corral-gateway-net`; empty: this "
            "process's host name, Docker's default for a container's)."
        ),
    )
    swarm_constraints: str = Field(
        default="",
        description=(
            "With `CORRAL_RUNTIME=swarm`: placement constraints for every sandbox and proxy, comma-separated "
            "(`node.labels.corral==yes`)."
        ),
    )
    swarm_start_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="With `CORRAL_RUNTIME=swarm`: how long a task may take to be placed, pull its image and run.",
    )
    swarm_encrypted_overlays: bool = Field(
        default=False,
        description=(
            "With `CORRAL_RUNTIME=swarm`: every overlay Corral makes is encrypted (IPsec between nodes; open IP "
            "protocol 50 between them). Without it, a session's traffic between nodes, the brokered secrets' values "
            "to its proxy among it, crosses the nodes' LAN in the clear ([swarm.md](swarm.md))."
        ),
    )
