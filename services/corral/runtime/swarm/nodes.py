"""The swarm's machines as the gateway sees them (:meth:`SandboxRuntime.nodes`), and a sandbox that
Swarm's ``drain`` stopped told apart from one that ended by itself (``NODE_DRAINED``, its session
``node_drained``): Swarm shuts a drained node's tasks down (state ``shutdown``, exit 137 after the
grace period) and, with restart condition none, starts them nowhere else (docs/design/0425)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import docker.errors

from corral.errors import SandboxError
from corral.runtime.swarm.engine import NODE_GONE, task_state
from corral.runtime.swarm.sandboxes import SwarmSandboxes
from corral.runtime.types import NODE_DRAINED, ExitInfo, NodeAvailability, NodeInfo

_AVAILABILITY: Mapping[str, NodeAvailability] = {"active": "active", "pause": "pause", "drain": "drain"}


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """One node record of the manager's (``GET /nodes``) as the runtime's; an availability this
    code does not know counts as ``pause`` (it takes no new sessions, ends none)."""
    name = str((node.get("Description") or {}).get("Hostname") or node.get("ID", ""))
    state = str((node.get("Status") or {}).get("State") or "unknown")
    availability = str((node.get("Spec") or {}).get("Availability") or "")
    return NodeInfo(name, state not in NODE_GONE, _AVAILABILITY.get(availability, "pause"))


def drained_exit(info: ExitInfo | None, task: Mapping[str, Any] | None, node: NodeInfo | None) -> ExitInfo | None:
    """``info`` as NODE_DRAINED when its task was shut down on a node that is drained (Swarm's doing,
    not the sandbox's); else ``info`` as it is."""
    if info is None or task is None or node is None or node.availability != "drain":
        return info
    if task_state(task) != "shutdown":
        return info  # it crashed or finished by itself before the drain reached it
    return ExitInfo(NODE_DRAINED, info.exit_code, False, info.node)


class SwarmNodes(SwarmSandboxes):
    def nodes(self) -> list[NodeInfo]:
        if self.guard is not None:
            # The gateway looks at the nodes every few ticks, sessions or none (the reaper): each
            # node's guard label follows its guard then (a node down loses it, one back gets it
            # within guardservice.REFRESH_S), not only while sandboxes are listed.
            self.guard.refresh()
        try:
            listed = self.client.api.nodes()
        except docker.errors.APIError as exc:
            raise SandboxError(f"swarm driver: cannot list the nodes: {exc.explanation or exc}") from None
        return [node_info(node) for node in listed]

    def exit_info(self, ident: str) -> ExitInfo | None:
        info = super().exit_info(ident)
        if info is None or info.state not in ("exited", "dead") or not info.node:
            return info
        node = next((n for n in self.nodes() if n.name == info.node), None)
        return drained_exit(info, self._task(ident), node)
