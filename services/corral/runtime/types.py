"""The values that cross the runtime seam: what the control plane asks a runtime for and what it
gets back. Nothing here names a driver; :mod:`corral.runtime.docker` fills them from Docker, a
Kubernetes driver would fill them from pods (docs/kubernetes.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# Every object a runtime makes for a session carries this label with the session's id: how a
# restarted gateway finds a session's proxy and network again, and how the runtime names them.
SESSION_LABEL = "corral.session"

# A sandbox's or a proxy's state as a runtime reports it (Docker's words, which Kubernetes' pod
# phases and container states map onto: docs/kubernetes.md).
State = Literal["created", "running", "paused", "restarting", "removing", "exited", "dead"]
# ExitInfo.state of a sandbox whose machine left the cluster or was cut off from it (a multi-node
# runtime's: the session ends with reason ``node_lost``); its processes may still run there, unreachable.
NODE_LOST = "node_lost"
# ExitInfo.state of a sandbox its cluster stopped because its machine was drained (Swarm's
# ``--availability drain`` stops a node's tasks): the session ends with reason ``node_drained``.
NODE_DRAINED = "node_drained"
# Whether a machine takes new sandboxes (Swarm's words): ``pause`` keeps its running ones and takes
# no new ones (draining it for Corral), ``drain`` stops its running ones too.
NodeAvailability = Literal["active", "pause", "drain"]
# A sandbox in one of these still counts as alive: its session goes on.
ALIVE_STATES: frozenset[State] = frozenset({"running", "paused", "restarting", "created"})


@dataclass(frozen=True, slots=True)
class SandboxAddress:
    """Where a running sandbox's controller answers, and the per-boot secret that drives it."""

    id: str
    name: str
    host: str
    port: int
    secret: str = field(default="", repr=False)
    # The machine it runs on, as its runtime names it (a Swarm node's host name; "" on one host).
    node: str = ""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/ws"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A machine sandboxes run on, as its runtime sees it now."""

    name: str  # as SandboxAddress.node names it
    ready: bool  # it answers its cluster (False: down, gone, or cut off)
    availability: NodeAvailability

    @property
    def takes_sessions(self) -> bool:
        """A new sandbox may start, and a pooled one may wait, here."""
        return self.ready and self.availability == "active"


@dataclass(frozen=True, slots=True)
class SessionNetwork:
    """A session's own internal network: its sandbox and its egress proxy, nothing else.

    ``subnet`` and ``gateway`` are what the sandbox's own firewall is set from."""

    name: str
    subnet: str
    gateway: str


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """How to start one sandbox."""

    image: str = "corral-desktop:latest"
    screen: str = "1280x800"
    name: str | None = None
    host_port: int | None = None
    memory: str = "2g"
    cpus: float = 2.0
    pids: int = 1024
    shm_size: str = "256m"
    tmp_size: str = "1g"
    # /workspace, the agent's commands' default directory: a tmpfs (programs may run from it), gone with it.
    workspace_size: str = "1g"
    # A workspace volume's host mount (corral.runtime's attach_volume): bind-mounted read-write at
    # /workspace in place of the tmpfs above, so what the agent writes there outlives the sandbox.
    workspace_mount: str | None = None
    labels: Mapping[str, str] | None = None
    environment: Mapping[str, str] | None = None
    # On a shared network: reached at the sandbox's address there and nothing is published on the host.
    network: str | None = None
    # On its session's own network instead, behind its egress proxy: the runtime tells the sandbox
    # where the proxy is and what its network is (its firewall is set from them).
    session_network: SessionNetwork | None = None
    # Host file -> path inside, mounted read-only and readable by the sandbox's controller alone.
    files: Mapping[str, str] | None = None
    # An OCI runtime registered with dockerd; None: the daemon's default (runc). Only bench/gvisor.py and
    # its tests set it: the gateway does not offer runsc, which loses the inner boundary (docs/gvisor.md).
    runtime: str | None = None


@dataclass(frozen=True, slots=True)
class ProxySpec:
    """How to start one session's egress proxy (corral-egress), the other half of its pair."""

    session_id: str
    network: SessionNetwork
    # On the host: CA, policy, audit log. Mounted read-write and handed to the proxy's uid; it
    # outlives the proxy, so a restarted proxy continues the same chain with the same CA.
    state_dir: Path
    egress_network: str | None  # None: a hermetic proxy, on the session network only (no route out)
    image: str = "corral-egress:latest"
    environment: Mapping[str, str] | None = None
    labels: Mapping[str, str] | None = None
    memory: str = "512m"
    cpus: float = 1.0
    pids: int = 256


@dataclass(frozen=True, slots=True)
class ProxyAddress:
    """A running proxy and its address on its session network (where the gateway's control calls go)."""

    id: str
    name: str
    address: str


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """How a sandbox that no longer runs ended: what a session whose sandbox died reports."""

    state: str  # "exited", "dead", "gone" (it no longer exists), or NODE_LOST (its machine left or was cut off)
    exit_code: int | None
    oom_killed: bool  # the kernel's OOM killer struck inside it
    node: str = ""  # where it ran ("" on one host)


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A sandbox as the runtime finds it (for recovery after a gateway restart)."""

    id: str
    name: str
    labels: Mapping[str, str]
    running: bool
    address: SandboxAddress | None
    node: str = ""  # where it runs or ran ("" on one host)


@dataclass(frozen=True, slots=True)
class VolumeMount:
    """A workspace volume's image attached on the host: its block device and where it is mounted
    (None: attached but not mounted, as a crash can leave it)."""

    image: Path
    device: str
    mountpoint: Path | None


@dataclass(frozen=True, slots=True)
class VolumeUsage:
    """A mounted volume's filesystem as statfs counts it (never a walk of what the sandbox wrote)."""

    used_bytes: int
    total_bytes: int
    used_inodes: int
    total_inodes: int


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """An image as the engine describes it: its id, its layers (by content, oldest first) and what
    its configuration says of how a container starts (what a template may not change)."""

    id: str
    layers: tuple[str, ...]
    entrypoint: tuple[str, ...] | None
    cmd: tuple[str, ...] | None
    user: str
    healthcheck: tuple[str, ...] | None
    env: tuple[str, ...]
    volumes: tuple[str, ...]
    labels: Mapping[str, str]
    size: int


@dataclass(frozen=True, slots=True)
class BuildStep:
    """Where a build failed: the step (its Dockerfile line) and the end of its output."""

    step: str
    output: str


@dataclass(frozen=True, slots=True)
class DirectoryEntry:
    """One entry of an image's directory as the template check reads it: where it links (None: no
    link) and a digest of its type, mode, owner, link and content."""

    link: str | None
    digest: str


@dataclass(frozen=True, slots=True)
class SwarmOptions:
    """What the swarm driver is told (``CORRAL_SWARM_*``, corral.gateway.settings)."""

    # The container the gateway runs in: connected to each session's overlay (a process in a node's
    # own namespace cannot reach overlay addresses). "": this process's host name, Docker's default
    # for a container's (its short id).
    gateway_container: str = ""
    # Placement constraints every sandbox and proxy service gets (``node.labels.corral==yes``).
    constraints: tuple[str, ...] = ()
    # How long a task may take to be placed, pull its image and run.
    start_timeout_s: float = 120.0
    # Where the controllers' secrets are kept for a restarted gateway (0700; None: not kept, and a
    # restarted gateway cannot drive the sandboxes it finds).
    secrets_dir: Path | None = None
    # The image the host guard runs on every node (runtime/swarm/guardservice.py): the sandboxes'
    # registry reference. "": no guard, sessions placed anywhere, and /v1/health's host_guard false.
    guard_image: str = ""
    # Every overlay the driver makes encrypted (Swarm's IPsec between nodes, IP protocol 50 open between
    # them): what crosses a node's LAN on a session's overlay (the brokered secrets' values to its proxy,
    # the gateway's token, the controller's answers) is readable there otherwise.
    encrypted_overlays: bool = False
