"""A runtime in memory: every operation of :class:`~corral.runtime.SandboxRuntime` and nothing
more (test_seam.py holds it to that), checked against the Protocol by mypy (pyproject's ``files``).
The gateway's unit tests run their sessions on it; what they steer or inspect is plain attributes."""

from __future__ import annotations

import io
import ipaddress
import tarfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from corral.errors import ProfileRefused, ProfileTooLarge, SandboxError
from corral.runtime import (
    NODE_DRAINED,
    NODE_LOST,
    DirectoryEntry,
    ExitInfo,
    ImageInfo,
    NodeInfo,
    ProxyAddress,
    ProxySpec,
    SandboxAddress,
    SandboxInfo,
    SandboxRuntime,
    SandboxSpec,
    SessionNetwork,
    State,
    VolumeMount,
    VolumeUsage,
)

from .ldcachefile import cache


def _matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in wanted.items())


class FakeRuntime:
    def __init__(self) -> None:
        self.shares_proxy_state = True  # a test sets False to have the gateway mirror the proxy's state
        self.running: dict[str, tuple[SandboxAddress, dict[str, str]]] = {}
        self.exited: dict[str, ExitInfo] = {}  # sandbox id -> how it died (still listed, not running)
        self.browser_states: dict[str, bytes] = {}  # sandbox id -> its browser state's archive
        self.refuse_import: str | None = None  # the reason every import is refused for
        self.networks: dict[str, SessionNetwork] = {}
        self.network_labels: dict[str, dict[str, str]] = {}
        self.guarded: set[str] = set()  # the networks with a host guard
        self.proxies: dict[str, tuple[ProxyAddress, dict[str, str], State]] = {}  # by session id
        self.fail_remove = False
        self.volumes: dict[Path, int] = {}  # image -> size in MiB
        self.attached: dict[Path, VolumeMount] = {}  # image -> its mount
        self.used: dict[Path, int] = {}  # image -> bytes a test says are used
        self.specs: list[SandboxSpec] = []  # every spec started, in order
        # The machines, as a multi-node runtime lists them ([]: one host). A sandbox starts on the one
        # that takes sessions with the fewest sandboxes, as Swarm's spread places tasks.
        self.node_list: list[NodeInfo] = []
        self._n = 0
        # Images by reference and by id; a build "runs" the Dockerfile's lines through ``on_build``
        # (a test's: it may raise TemplateBuildFailed, or change the image the build makes).
        self.images: dict[str, ImageInfo] = {}
        self.builds: list[str] = []  # each build's Dockerfile, in order
        self.on_build: Callable[[str, ImageInfo], ImageInfo] = lambda dockerfile, image: image
        self.digests: dict[str, dict[str, str]] = {}  # image id -> path -> digest (default: the base's "same")
        self.setuid: dict[str, list[str]] = {}  # image id -> its setuid files (default none)
        self.links: dict[str, str] = {}  # path -> where it links, the same in every image (default: no link)
        self.library_paths: set[str] = {"/lib/x86_64-linux-gnu/libc.so.6"}  # files directory_entries lists
        self.forgotten: list[str] = []
        self.build_networks: list[str] = []
        self.files: dict[str, dict[str, bytes]] = {}  # image id -> path -> bytes (default: base_files)
        # Every image's loader cache, unless a test says otherwise (a template's check reads it).
        self.base_files: dict[str, bytes] = {
            "/etc/ld.so.cache": cache([("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6")])
        }

    # -- shared networks -------------------------------------------------------------------------------

    def ensure_sandbox_network(self, name: str) -> bool:
        self.guarded.add(name)
        return True

    def ensure_egress_network(self, name: str) -> bool:
        self.guarded.add(name)
        return True

    def remove_stale_guards(self) -> list[str]:
        return []

    # -- session networks ------------------------------------------------------------------------------

    def create_session_network(self, session_id: str, labels: Mapping[str, str], subnets: str) -> SessionNetwork:
        subnet = list(ipaddress.IPv4Network(subnets).subnets(new_prefix=28))[len(self.networks)]
        network = SessionNetwork(f"net-{session_id}", str(subnet), str(subnet[1]))
        self.networks[network.name] = network
        self.network_labels[network.name] = {**labels, "corral.session": session_id}
        self.guarded.add(network.name)
        return network

    def session_networks(self, labels: Mapping[str, str]) -> list[SessionNetwork]:
        return [net for name, net in self.networks.items() if _matches(self.network_labels[name], labels)]

    def remove_session_network(self, network: SessionNetwork) -> None:
        self.networks.pop(network.name, None)
        self.guarded.discard(network.name)

    # -- sandboxes -------------------------------------------------------------------------------------

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        self._n += 1
        self.specs.append(spec)
        node = self._place()
        box = SandboxAddress(f"c{self._n}", spec.name or f"c{self._n}", f"10.99.0.{self._n + 1}", 8765, node=node)
        self.running[box.id] = (box, dict(spec.labels or {}))
        return box

    def _place(self) -> str:
        if not self.node_list:
            return ""
        open_ = [n.name for n in self.node_list if n.takes_sessions]
        if not open_:
            raise SandboxError("no node takes new sandboxes (every one is paused, drained or down)")
        load = {name: 0 for name in open_}
        for box, _ in self.running.values():
            if box.node in load and box.id not in self.exited:
                load[box.node] += 1
        return min(open_, key=lambda name: load[name])

    def wait_ready(self, sandbox: SandboxAddress, timeout_s: float = 60.0) -> float:
        return 0.0

    def list_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        wanted = dict(labels or {})
        return [
            SandboxInfo(b.id, b.name, lab, b.id not in self.exited, b, node=b.node)
            for b, lab in self.running.values()
            if _matches(lab, wanted)
        ]

    def remove(self, ident: str) -> None:
        if self.fail_remove:
            raise RuntimeError("the runtime said no")
        self.running.pop(ident, None)
        self.exited.pop(ident, None)

    # -- the browser's state ---------------------------------------------------------------------------

    def export_browser_state(self, ident: str, max_bytes: int, timeout_s: float = 60.0) -> bytes:
        if ident not in self.running:
            raise SandboxError(f"no sandbox {ident}")
        state = self.browser_states.get(ident, b"")
        if len(state) > max_bytes:
            raise ProfileTooLarge(f"the browser's state is over {max_bytes} bytes")
        return state

    def import_browser_state(self, ident: str, archive: bytes, max_bytes: int, timeout_s: float = 60.0) -> int:
        if ident not in self.running:
            raise SandboxError(f"no sandbox {ident}")
        if self.refuse_import is not None:
            raise ProfileRefused(f"the sandbox refused the profile: {self.refuse_import}")
        if len(archive) > max_bytes:
            raise ProfileTooLarge(f"the archive is over {max_bytes} bytes")
        self.browser_states[ident] = archive
        return len(archive)

    # -- liveness --------------------------------------------------------------------------------------

    def sandbox_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        return {
            box.id: ("exited" if box.id in self.exited else "running")
            for box, lab in self.running.values()
            if _matches(lab, labels)
        }

    def exit_info(self, ident: str) -> ExitInfo | None:
        if ident not in self.running:
            return ExitInfo("gone", None, False)
        return self.exited.get(ident)

    def nodes(self) -> list[NodeInfo]:
        return list(self.node_list)

    # -- egress pairs ----------------------------------------------------------------------------------

    def start_proxy(self, spec: ProxySpec) -> ProxyAddress:
        proxy = ProxyAddress(f"p-{spec.session_id}", f"proxy-{spec.session_id}", "127.0.0.1")
        self.proxies[spec.session_id] = (proxy, {**(spec.labels or {}), "corral.session": spec.session_id}, "running")
        return proxy

    def proxy_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        return {sid: state for sid, (_, lab, state) in self.proxies.items() if _matches(lab, labels)}

    def restart_proxy(self, session_id: str) -> ProxyAddress:
        proxy, labels, _ = self.proxies[session_id]
        self.proxies[session_id] = (proxy, labels, "running")
        return proxy

    def stop_proxy(self, session_id: str) -> None:
        proxy, labels, _ = self.proxies[session_id]
        self.proxies[session_id] = (proxy, labels, "exited")

    def proxy_logs(self, session_id: str, tail: int = 100) -> str:
        return ""

    def remove_egress(self, session_id: str, *, drain: bool = False) -> None:
        self.proxies.pop(session_id, None)
        self.remove_session_network(SessionNetwork(f"net-{session_id}", "", ""))

    # -- workspace volumes -----------------------------------------------------------------------------

    def make_volume(self, image: Path, size_mb: int) -> VolumeUsage:
        image.parent.mkdir(parents=True, exist_ok=True)
        image.write_bytes(b"")  # the file stands for the image: the gateway deletes it
        self.volumes[image] = size_mb
        return VolumeUsage(0, size_mb << 20, 11, 1024)

    def attach_volume(self, image: Path, mountpoint: Path) -> VolumeMount:
        if image in self.attached:
            raise AssertionError(f"{image} attached twice")
        mount = VolumeMount(image, f"/dev/loop{len(self.attached)}", mountpoint)
        self.attached[image] = mount
        return mount

    def detach_volume(self, mount: VolumeMount) -> None:
        self.attached.pop(mount.image, None)

    def volume_usage(self, mountpoint: Path) -> VolumeUsage:
        image = next(m.image for m in self.attached.values() if m.mountpoint == mountpoint)
        return VolumeUsage(self.used.get(image, 0), self.volumes[image] << 20, 11, 1024)

    def attached_volumes(self, images: Path) -> list[VolumeMount]:
        return [m for m in self.attached.values() if m.image.parent == images]

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
        self.build_networks.append(network)
        with tarfile.open(fileobj=io.BytesIO(context)) as archive:
            handle = archive.extractfile("Dockerfile")
            assert handle is not None
            dockerfile = handle.read().decode()
        self.builds.append(dockerfile)
        base = self.images[base_id]
        self._n += 1
        made = replace(
            base, id=f"sha256:img{self._n}", layers=(*base.layers, f"l{self._n}"), labels={**base.labels, **labels}
        )
        for line in dockerfile.splitlines():
            sink(line)
        made = self.on_build(dockerfile, made)
        self.images[made.id] = self.images[tag] = made
        return made.id

    def image_info(self, name: str) -> ImageInfo | None:
        return self.images.get(name)

    def tag_image(self, image_id: str, reference: str) -> None:
        self.images[reference] = self.images[image_id]

    def remove_image(self, reference: str) -> None:
        image = self.images.pop(reference, None)
        named = any(img.id == image.id for ref, img in self.images.items() if ref != image.id) if image else True
        if image is not None and not named:  # its last name went: the image goes (an engine's rmi)
            self.images.pop(image.id, None)

    def forget_images(self, images: Sequence[str], keep: str = "") -> None:
        self.forgotten.extend(image for image in images if image != keep)

    def path_digests(self, image: str, paths: Sequence[str]) -> dict[str, str]:
        mine = self.digests.get(self.images[image].id, {})
        return {path: mine.get(path, "same") for path in paths}

    def read_files(self, image: str, paths: Sequence[str], limit: int) -> dict[str, bytes | None]:
        mine = self.files.get(self.images[image].id, {})
        return {path: (mine[path][:limit] if path in mine else self.base_files.get(path)) for path in paths}

    def setuid_files(self, image: str) -> list[str]:
        return list(self.setuid.get(self.images[image].id, []))

    def link_targets(self, image: str, paths: Sequence[str]) -> dict[str, str | None]:
        return {path: self.links.get(path) for path in paths}

    def directory_entries(
        self, image: str, directory: str, digested: Collection[str] | None = None
    ) -> dict[str, DirectoryEntry]:
        """The entries the tests named under ``directory`` (in links, digests or the loader cache)."""
        mine = self.digests.get(self.images[image].id, {})
        named = {*self.links, *mine, *self.library_paths}
        return {
            path.rsplit("/", 1)[1]: DirectoryEntry(self.links.get(path), mine.get(path, "same"))
            for path in named
            if path.rsplit("/", 1)[0] == directory
        }

    def path_entries(self, image: str, paths: Sequence[str]) -> dict[str, DirectoryEntry | None]:
        """The entries the tests named (in links, digests or the loader cache); None for the rest."""
        mine = self.digests.get(self.images[image].id, {})
        named = {*self.links, *mine, *self.library_paths}
        return {
            path: DirectoryEntry(self.links.get(path), mine.get(path, "same")) if path in named else None
            for path in paths
        }

    # -- what tests do to it ---------------------------------------------------------------------------

    def die(self, ident: str, info: ExitInfo) -> None:
        self.exited[ident] = info

    def lose_node(self, name: str) -> None:
        """The machine goes down or is cut off: every sandbox on it reads NODE_LOST."""
        self._set_node(name, NodeInfo(name, False, "active"), NODE_LOST)

    def drain_node(self, name: str) -> None:
        """The machine is drained (Swarm's ``drain``): every sandbox on it is stopped, NODE_DRAINED."""
        self._set_node(name, NodeInfo(name, True, "drain"), NODE_DRAINED)

    def _set_node(self, name: str, node: NodeInfo, state: str) -> None:
        self.node_list = [node if n.name == name else n for n in self.node_list]
        for box, _ in self.running.values():
            if box.node == name:
                self.exited.setdefault(box.id, ExitInfo(state, None, False, node=name))


def as_runtime(fake: FakeRuntime) -> SandboxRuntime:
    """Where mypy proves the fake is a whole SandboxRuntime (a missing or mistyped method fails here)."""
    return fake
