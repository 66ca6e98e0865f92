"""deploy/swarm/gateway.yaml against what the swarm runtime expects of it (docs/design/0412): the
gateway runs in the namespace of a holder that is never restarted with it, and the runtime is told
to join that holder, by its container name, to each session's overlay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "swarm" / "gateway.yaml"
DEFAULT = "${CORRAL_SWARM_GATEWAY_CONTAINER:-corral-gateway}"


def _services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(DEPLOY.read_text())["services"]
    return services


def test_the_gateway_runs_in_the_holders_namespace_and_publishes_nothing_of_its_own() -> None:
    gateway = _services()["gateway"]
    assert gateway["network_mode"] == "service:network"
    assert "ports" not in gateway and "networks" not in gateway and "hostname" not in gateway


def test_the_runtime_joins_the_holder_by_its_container_name() -> None:
    services = _services()
    holder = services["network"]
    assert holder["container_name"] == f"{DEFAULT}-net"
    assert services["gateway"]["environment"]["CORRAL_SWARM_GATEWAY_CONTAINER"] == holder["container_name"]
    assert services["gateway"]["container_name"] == DEFAULT  # its logs and restarts keep the documented name


def test_the_holder_holds_nothing_else() -> None:
    holder = _services()["network"]
    assert holder["user"] == "65534:65534" and holder["read_only"] is True and holder["cap_drop"] == ["ALL"]
    assert "volumes" not in holder  # no Docker socket, no state: nothing to take if it were entered
    assert holder["restart"] == "unless-stopped"
