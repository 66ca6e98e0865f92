"""Where and how sandboxes run. :class:`SandboxRuntime` is everything the control plane asks of a
runtime: networks and their naming, sandboxes, each session's egress pair (sandbox and proxy), the
host guard, the ownership of what it mounts, liveness. :func:`open_runtime` picks the driver named
by ``CORRAL_RUNTIME``: :mod:`corral.runtime.docker` (one host) or :mod:`corral.runtime.swarm` (a Docker
Swarm), the only modules that talk to Docker. docs/kubernetes.md maps every operation onto Kubernetes objects."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from corral.errors import SandboxError
from corral.runtime.types import (
    ALIVE_STATES,
    NODE_DRAINED,
    NODE_LOST,
    SESSION_LABEL,
    DirectoryEntry,
    ExitInfo,
    ImageInfo,
    NodeAvailability,
    NodeInfo,
    ProxyAddress,
    ProxySpec,
    SandboxAddress,
    SandboxInfo,
    SandboxSpec,
    SessionNetwork,
    State,
    SwarmOptions,
    VolumeMount,
    VolumeUsage,
)

__all__ = [
    "ALIVE_STATES",
    "DRIVERS",
    "NODE_DRAINED",
    "NODE_LOST",
    "SESSION_LABEL",
    "DirectoryEntry",
    "ExitInfo",
    "ImageInfo",
    "NodeAvailability",
    "NodeInfo",
    "ProxyAddress",
    "ProxySpec",
    "SandboxAddress",
    "SandboxInfo",
    "SandboxRuntime",
    "SandboxSpec",
    "SessionNetwork",
    "State",
    "SwarmOptions",
    "VolumeMount",
    "VolumeUsage",
    "open_runtime",
]

DRIVERS = ("docker", "swarm")  # the values CORRAL_RUNTIME takes


class SandboxRuntime(Protocol):
    """What the control plane calls, and all of it (tests/unit/runtime/fake.py implements exactly
    this). Every method blocks: the gateway runs them in threads."""

    # Whether a proxy writes into ``ProxySpec.state_dir`` itself (the docker driver's bind mount).
    # False (a proxy on another node: the swarm driver): the runtime seeds the proxy from that
    # directory (corral.proxy.seed) and the gateway mirrors the proxy's audit log and recorded
    # responses back into it over the control channel (corral.gateway.egress.mirror).
    shares_proxy_state: bool

    # -- shared networks -------------------------------------------------------------------------------

    def ensure_sandbox_network(self, name: str) -> bool:
        """The network sandboxes share without egress control; made if missing. Returns whether the
        host guard holds on it (no way from it into the host's own services)."""
        ...

    def ensure_egress_network(self, name: str) -> bool:
        """The network proxies reach upstreams through; made if missing. Returns whether the host
        guard holds on it. Raises SandboxError when proxies could not be given their state."""
        ...

    def remove_stale_guards(self) -> list[str]:
        """Host-guard rules of networks that went while no gateway watched; returns what went."""
        ...

    # -- session networks ------------------------------------------------------------------------------

    def create_session_network(self, session_id: str, labels: Mapping[str, str], subnets: str) -> SessionNetwork:
        """A session's own network (no route out), named by the runtime, with a subnet from
        ``subnets`` and its host guard."""
        ...

    def session_networks(self, labels: Mapping[str, str]) -> list[SessionNetwork]:
        """Every session network carrying ``labels`` (the gateway's reconcile on start)."""
        ...

    def remove_session_network(self, network: SessionNetwork) -> None:
        """The network and its host guard; nothing when it is gone already."""
        ...

    # -- sandboxes -------------------------------------------------------------------------------------

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        """Started, with its controller's per-boot secret read; not yet ready (see wait_ready)."""
        ...

    def wait_ready(self, sandbox: SandboxAddress, timeout_s: float = 60.0) -> float:
        """Block until the controller answers its health check with its proof; returns the seconds."""
        ...

    def list_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        """Every sandbox (running or not) carrying ``labels``, with its address when it runs."""
        ...

    def remove(self, ident: str) -> None:
        """Remove a sandbox for good; nothing when it is gone already."""
        ...

    # -- the browser's state ---------------------------------------------------------------------------

    def export_browser_state(self, ident: str, max_bytes: int, timeout_s: float = 60.0) -> bytes:
        """A running sandbox's browser state (cookies, local storage, IndexedDB) as the archive its
        sandbox made (corral.sandbox.web.statearchive), Chromium stopped for the copy and started again;
        ProfileTooLarge past ``max_bytes``, ProfileRefused when the sandbox could not make it."""
        ...

    def import_browser_state(self, ident: str, archive: bytes, max_bytes: int, timeout_s: float = 60.0) -> int:
        """``archive`` checked and unpacked inside the sandbox and its browser restarted onto it (done
        when Chromium listens again); the bytes of files put in place. ProfileRefused for an archive
        the sandbox will not take (a link, a path outside the profile), ProfileTooLarge past ``max_bytes``."""
        ...

    # -- liveness --------------------------------------------------------------------------------------

    def sandbox_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        """Sandbox id -> state of every sandbox with ``labels``, from one listing (asked every second)."""
        ...

    def exit_info(self, ident: str) -> ExitInfo | None:
        """None while the sandbox lives; else how it ended (NODE_LOST: its machine is down or cut off,
        NODE_DRAINED: its machine was drained; sandbox_states then no longer counts it alive)."""
        ...

    def nodes(self) -> list[NodeInfo]:
        """The machines sandboxes run on, from one listing (the reaper asks with the pool's check, to
        replace pooled sandboxes on a machine that takes no new ones); [] for a runtime of one machine,
        which always takes them."""
        ...

    # -- egress pairs ----------------------------------------------------------------------------------

    def start_proxy(self, spec: ProxySpec) -> ProxyAddress:
        """A session's proxy on its session network (where its sandbox finds it) and the egress network."""
        ...

    def proxy_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        """Session id -> state of the proxy of every session whose proxy carries ``labels``."""
        ...

    def restart_proxy(self, session_id: str) -> ProxyAddress:
        """Start a session's stopped or dead proxy again; its address may have changed."""
        ...

    def stop_proxy(self, session_id: str) -> None:
        """Stop a session's proxy and keep its container (a paused session's: :meth:`restart_proxy`
        starts it again with its state, chain and CA as they were)."""
        ...

    def proxy_logs(self, session_id: str, tail: int = 100) -> str:
        """The last lines a session's proxy wrote (to say why it did not come up)."""
        ...

    def remove_egress(self, session_id: str, *, drain: bool = False) -> None:
        """A session's proxy (given a moment to write out what it holds when ``drain``), then its
        network and host guard; whatever of them exists. The proxy's state directory stays."""
        ...

    # -- workspace volumes -----------------------------------------------------------------------------
    # A volume is an image file with a filesystem of its own (its size is its quota), attached and
    # mounted on the host for one session at a time and mounted into its sandbox at /workspace
    # (docs/design/0330-workspace-volumes.md). Nothing here reads what the sandbox wrote into it.

    def make_volume(self, image: Path, size_mb: int) -> VolumeUsage:
        """A new volume image of ``size_mb`` (its space reserved), its root the agent's; returns its
        usage when empty. Raises SandboxError (and leaves no image) when it cannot be made."""
        ...

    def attach_volume(self, image: Path, mountpoint: Path) -> VolumeMount:
        """The image attached and mounted at ``mountpoint`` (nosuid, nodev), ready to hand to
        :attr:`SandboxSpec.workspace_mount`. Raises SandboxError, leaving nothing attached."""
        ...

    def detach_volume(self, mount: VolumeMount) -> None:
        """Unmounted and detached (after the sandbox using it is removed); nothing when gone already."""
        ...

    def volume_usage(self, mountpoint: Path) -> VolumeUsage:
        """A mounted volume's usage by statfs; OSError when nothing is mounted at ``mountpoint``."""
        ...

    def attached_volumes(self, images: Path) -> list[VolumeMount]:
        """Every attached image under ``images`` (a restarted gateway's look for what nobody holds)."""
        ...

    # -- template images -------------------------------------------------------------------------------

    def build_image(
        self,
        context: bytes,
        tag: str,
        labels: Mapping[str, str],
        sink: Callable[[str], None],
        base_id: str,
        network: str,
    ) -> str:
        """An image built from ``context`` (a tar with its ``Dockerfile``), tagged ``tag``, its ``RUN`` steps
        on ``network`` (the guarded network of sandboxes without egress control); its id. Each
        output line goes to ``sink``. A failure raises TemplateBuildFailed (the step and its output)
        having removed what the build made (never ``base_id``)."""
        ...

    def image_info(self, name: str) -> ImageInfo | None:
        """The image ``name`` (a reference or an id) as the engine has it; None if there is none."""
        ...

    def tag_image(self, image_id: str, reference: str) -> None:
        """Name the image ``image_id`` ``reference`` (``repository:tag``) too."""
        ...

    def remove_image(self, reference: str) -> None:
        """Drop the name ``reference``, and its image once nothing names it or stands on it; nothing if absent."""
        ...

    def forget_images(self, images: Sequence[str], keep: str = "") -> None:
        """Remove images no name and no other image holds (a failed or refused build's), newest last."""
        ...

    def path_digests(self, image: str, paths: Sequence[str]) -> dict[str, str]:
        """Each path's digest in ``image`` (entries, modes, owners, contents), read without running it."""
        ...

    def read_files(self, image: str, paths: Sequence[str], limit: int) -> dict[str, bytes | None]:
        """Each file's first ``limit`` bytes in ``image`` (None: no such regular file), read without running it."""
        ...

    def setuid_files(self, image: str) -> list[str]:
        """The setuid and setgid files of ``image``."""
        ...

    def link_targets(self, image: str, paths: Sequence[str]) -> dict[str, str | None]:
        """Where each path, a symbolic link, points in ``image`` (None: no link there), read without running it."""
        ...

    def directory_entries(
        self, image: str, directory: str, digested: Collection[str] | None = None
    ) -> dict[str, DirectoryEntry]:
        """Every entry directly in ``directory`` of ``image``: its link target and digest (of the
        ``digested`` names only, when given; the others' empty), read without running it."""
        ...

    def path_entries(self, image: str, paths: Sequence[str]) -> dict[str, DirectoryEntry | None]:
        """Each path's own entry in ``image`` (None: nothing there), its link target and digest as
        ``directory_entries`` gives them (a directory's, without what it holds), read without running it."""
        ...


def open_runtime(
    driver: str,
    *,
    proxy_uid: int | None = None,
    swarm: SwarmOptions | None = None,
    handover_dir: Path | None = None,
) -> SandboxRuntime:
    """The runtime ``driver`` names (``CORRAL_RUNTIME``); ``proxy_uid`` is CORRAL_EGRESS_UID, ``swarm``
    the swarm driver's ``CORRAL_SWARM_*``, ``handover_dir`` where the docker driver writes each sandbox's
    controller secret for its start (a directory the engine sees at the same path).

    Raises SandboxError for a driver there is none of, or when its engine cannot be reached."""
    if driver == "docker":
        from corral.runtime.docker import DockerRuntime  # imported here: the docker SDK only when chosen

        return DockerRuntime(proxy_uid=proxy_uid, handover_dir=handover_dir)
    if driver == "swarm":
        from corral.runtime.swarm import SwarmRuntime

        return SwarmRuntime(options=swarm)
    raise SandboxError(f"CORRAL_RUNTIME={driver!r}: no such runtime driver (there is {', '.join(DRIVERS)})")
