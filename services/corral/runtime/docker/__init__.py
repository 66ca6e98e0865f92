"""The one package that talks to Docker: images, sandbox containers, their networks, their egress
proxies and the host guard on their bridges; the Docker driver of :class:`~corral.runtime.SandboxRuntime`.

Everything here goes through the docker SDK (no ``docker`` CLI strings), but for ``docker compose``.
One module per concern, each a part of :class:`DockerRuntime`: :mod:`.engine` (the client, names,
limits, pure helpers), :mod:`.images`, :mod:`.handover` (files to the controller, its secret back),
:mod:`.sandboxes`, :mod:`.networks`, :mod:`.egress` (each session's proxy), :mod:`.volumes`
(workspace volumes' images, loop devices and mounts) and :mod:`.templates` (template images: build,
inspect, the check's looks). Nothing outside this
package imports the docker SDK.
"""

from __future__ import annotations

from corral.runtime.docker.browserstate import BrowserStates
from corral.runtime.docker.egress import Egress, proxy_options
from corral.runtime.docker.engine import (
    AGENT_UID,
    CONTROLLER_PORT,
    CONTROLLER_UID,
    CONTROLLER_USER,
    EGRESS_ROLE,
    EGRESS_STATE,
    EGRESS_UID,
    LOG_CONFIG,
    MIN_HEADROOM_MIB,
    MIN_TMPFS_MIB,
    NETWORK_ROLE,
    SANDBOX_LABEL,
    SANDBOX_ROLE,
    SECRET_WAIT_S,
    LineSink,
    agent_tmpfs_mib,
    default_proxy_uid,
    hand_over,
    mebibytes,
    proxy_name,
    remapped_root,
    session_network_name,
)
from corral.runtime.docker.images import Images
from corral.runtime.docker.sandboxes import Sandboxes, sandbox_options
from corral.runtime.docker.templates import TemplateImages
from corral.runtime.docker.volumes import Volumes
from corral.runtime.types import NodeInfo

__all__ = [
    "AGENT_UID",
    "CONTROLLER_PORT",
    "CONTROLLER_UID",
    "CONTROLLER_USER",
    "EGRESS_ROLE",
    "EGRESS_STATE",
    "EGRESS_UID",
    "LOG_CONFIG",
    "MIN_HEADROOM_MIB",
    "MIN_TMPFS_MIB",
    "NETWORK_ROLE",
    "SANDBOX_LABEL",
    "SANDBOX_ROLE",
    "SECRET_WAIT_S",
    "DockerRuntime",
    "LineSink",
    "agent_tmpfs_mib",
    "default_proxy_uid",
    "hand_over",
    "mebibytes",
    "proxy_name",
    "proxy_options",
    "remapped_root",
    "sandbox_options",
    "session_network_name",
]


class DockerRuntime(Images, TemplateImages, Sandboxes, Egress, Volumes, BrowserStates):
    """The Docker driver: a container per sandbox and per proxy, a bridge network per session, the
    host guard as iptables rules on the bridges, workspace volumes as loop-mounted images. Its parts
    share one docker client (:class:`.engine.Engine`)."""

    def nodes(self) -> list[NodeInfo]:
        """One machine, which always takes sandboxes: nothing to list (SandboxRuntime.nodes)."""
        return []
