"""The one module that talks to Docker: images, sandbox containers, exec.

Everything here goes through the docker SDK (no ``docker`` CLI strings).
"""

from __future__ import annotations

import contextlib
import ipaddress
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from corral.errors import ImageBuildError, SandboxError
from corral.sandbox import auth

SANDBOX_LABEL = "corral.role"
SANDBOX_ROLE = "sandbox"
EGRESS_ROLE = "egress"
NETWORK_ROLE = "network"
CONTROLLER_PORT = 8765
EGRESS_ALIAS = "corral-proxy"  # the proxy's name on its session network
EGRESS_STATE = "/var/lib/corral-egress"  # where the proxy keeps its CA, policy and audit log
EGRESS_UID = 1001  # the proxies' uid unless the gateway's settings say otherwise (EgressSpec.uid)
# Containers log to Docker's json-file driver: at most this much each, so a chatty or hostile
# sandbox cannot fill the host's disk through its logs.
LOG_CONFIG = {"type": "json-file", "config": {"max-size": "10m", "max-file": "3"}}
CONTROLLER_USER = "corral"  # the sandbox's controller uid; the only one that reads its secrets
CONTROLLER_UID = 1000
AGENT_UID = 1100  # the sandbox's agent uid: Chromium, and what the agent runs
SECRET_WAIT_S = 10.0  # boot writes the secret within its first tenth of a second

LineSink = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class SandboxContainer:
    """A running sandbox, where its controller answers, and the per-boot secret that drives it."""

    id: str
    name: str
    host: str
    port: int
    secret: str = field(default="", repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/ws"


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """How to start one sandbox container."""

    image: str = "corral-desktop:latest"
    screen: str = "1280x800"
    name: str | None = None
    host_port: int | None = None
    memory: str = "2g"
    cpus: float = 2.0
    pids: int = 1024
    shm_size: str = "256m"
    tmp_size: str = "1g"
    labels: Mapping[str, str] | None = None
    environment: Mapping[str, str] | None = None
    # On a network: reached at the container's address there and nothing is published on the host.
    network: str | None = None
    # Host file -> path inside, mounted read-only (secrets owned by the controller's uid, mode 0400).
    files: Mapping[str, str] | None = None
    # An OCI runtime registered with dockerd; None: the daemon's default (runc). Only bench/gvisor.py and
    # its tests set it: the gateway does not offer runsc, which loses the inner boundary (docs/gvisor.md).
    runtime: str | None = None


@dataclass(frozen=True, slots=True)
class SessionNetwork:
    """A session's own internal network: its sandbox and its egress proxy, nothing else."""

    name: str
    subnet: str
    gateway: str
    interface: str


@dataclass(frozen=True, slots=True)
class EgressSpec:
    """How to start one session's egress proxy (corral-egress)."""

    name: str
    state_dir: Path  # on the host: CA, policy, audit log; bind-mounted, so it outlives the container
    session_network: SessionNetwork
    egress_network: str | None  # None: a hermetic proxy, on the session network only (no route out)
    image: str = "corral-egress:latest"
    environment: Mapping[str, str] | None = None
    labels: Mapping[str, str] | None = None
    memory: str = "512m"
    cpus: float = 1.0
    pids: int = 256
    uid: int = EGRESS_UID  # the host uid (and gid) it runs as; it owns state_dir


@dataclass(frozen=True, slots=True)
class EgressContainer:
    id: str
    name: str
    address: str  # on the session network


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """How a container that no longer runs ended: what a session whose sandbox died reports."""

    state: str  # "exited", "dead", or "gone" (the container no longer exists)
    exit_code: int | None
    oom_killed: bool  # the kernel's OOM killer struck inside it (Docker's State.OOMKilled)


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A sandbox container as Docker reports it (for recovery after a gateway restart)."""

    id: str
    name: str
    labels: Mapping[str, str]
    running: bool
    address: SandboxContainer | None


class DockerRuntime:
    def __init__(self, client: docker.DockerClient | None = None) -> None:
        try:
            self._client = client or docker.from_env()
            self._client.ping()
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot reach the Docker engine: {exc}") from None

    @property
    def architecture(self) -> str:
        arch: str = self._client.info().get("Architecture", "x86_64")
        return arch

    # -- images ----------------------------------------------------------------------------------------

    def image_exists(self, name: str) -> bool:
        try:
            self._client.images.get(name)
        except docker.errors.ImageNotFound:
            return False
        return True

    def try_pull(self, name: str) -> bool:
        try:
            self._client.images.pull(name)
        except docker.errors.APIError:
            return False
        return True

    def import_rootfs(self, tarball: Path, repository: str, tag: str) -> None:
        try:
            self._client.api.import_image_from_file(str(tarball), repository=repository, tag=tag)
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker import of {tarball} failed: {exc}") from None

    def build(self, context: Path, dockerfile: str, tag: str, buildargs: Mapping[str, str], sink: LineSink) -> None:
        """Build with the engine's builder, streaming its output lines to ``sink``."""
        stream = self._client.api.build(
            path=str(context), dockerfile=dockerfile, tag=tag, buildargs=dict(buildargs), rm=True, decode=True
        )
        for chunk in stream:
            if "error" in chunk:
                raise ImageBuildError(f"building {tag} failed: {chunk['error'].strip()}")
            text = chunk.get("stream") or chunk.get("status")
            if text and text.strip():
                sink(text.rstrip())

    # -- sandboxes -------------------------------------------------------------------------------------

    def start_sandbox(self, spec: SandboxSpec) -> SandboxContainer:
        labels = {SANDBOX_LABEL: SANDBOX_ROLE, **(spec.labels or {})}
        # Boot runs as root to set the firewall (the agent uid's rules always, egress with a proxy), write
        # the controller's secret (CHOWN) and trust, then drops to corral keeping only SETUID, SETGID
        # and SETPCAP for the supervisor, which starts every child with none (corral.sandbox.boot).
        caps = ["SETUID", "SETGID", "SETPCAP", "CHOWN", "NET_ADMIN", "NET_RAW"]
        # A sandbox Corral starts never runs without its inner boundary (corral.sandbox.boot).
        environment = {"CORRAL_SCREEN": spec.screen, "CORRAL_INNER_BOUNDARY": "required", **(spec.environment or {})}
        placement: dict[str, Any] = (
            {"network": spec.network}
            if spec.network
            else {"ports": {f"{CONTROLLER_PORT}/tcp": ("127.0.0.1", spec.host_port)}}
        )
        try:
            container: Container = self._client.containers.run(
                spec.image,
                detach=True,
                name=spec.name,
                labels=labels,
                environment=environment,
                **placement,
                # Hardened by default: no capabilities once booted, no privilege gain, read-only root,
                # bounded resources.
                user="root",
                cap_drop=["ALL"],
                cap_add=caps,
                security_opt=["no-new-privileges"],
                read_only=True,
                tmpfs={
                    "/tmp": f"rw,nosuid,nodev,size={spec.tmp_size},mode=1777",
                    "/home/corral": "rw,nosuid,nodev,size=64m,uid=1000,gid=1000,mode=0700",
                    "/home/agent": f"rw,nosuid,nodev,size=512m,uid={AGENT_UID},gid={AGENT_UID},mode=0700",
                    "/run": "rw,nosuid,nodev,noexec,size=8m,mode=0755",
                    "/etc/ssl/certs": "rw,nosuid,nodev,noexec,size=8m,mode=0755",
                },
                volumes={host: {"bind": inside, "mode": "ro"} for host, inside in (spec.files or {}).items()},
                shm_size=spec.shm_size,
                mem_limit=spec.memory,
                memswap_limit=spec.memory,
                nano_cpus=int(spec.cpus * 1e9),
                pids_limit=spec.pids,
                init=False,  # the image runs tini itself
                # Docker runs a healthcheck as the container's user (root, for the boot stage) with the
                # sandbox user's home as its working directory: never. The gateway polls /healthz itself.
                healthcheck={"test": ["NONE"]},
                log_config=LOG_CONFIG,
                runtime=spec.runtime,
            )
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {spec.image} not found; build it with `corral images build`") from None
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot start a sandbox: {exc.explanation or exc}") from None
        try:
            container.reload()
        except docker.errors.APIError:
            container.remove(force=True)
            raise SandboxError(f"sandbox {container.name} vanished while starting") from None
        address = self._address(container)
        if address is None:
            container.remove(force=True)
            raise SandboxError(f"sandbox {container.name} started without a reachable address")
        try:
            return self._with_secret(address, SECRET_WAIT_S)
        except SandboxError:
            container.remove(force=True)
            raise

    def _with_secret(self, address: SandboxContainer, wait_s: float) -> SandboxContainer:
        """The address with its controller's per-boot secret, read inside the container as the
        controller's uid (the only one that may read it), the moment boot has written it."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                code, out = self._exec_within(
                    address.id, ["cat", str(auth.SECRET_FILE)], CONTROLLER_USER, max(deadline - time.monotonic(), 1.0)
                )
            except TimeoutError:
                raise SandboxError(
                    f"sandbox {address.name} did not answer an exec in {wait_s:.0f}s:\n{self.logs(address.id, 40)}"
                ) from None
            except docker.errors.APIError as exc:
                # Boot refusing to start (a firewall it cannot set) ends the container before the first
                # exec: say why, from its log, rather than "409 container is not running".
                if self._container(address.id).status in ("exited", "dead"):
                    raise SandboxError(
                        f"sandbox {address.name} exited while starting:\n{self.logs(address.id, 40)}"
                    ) from None
                raise SandboxError(f"cannot read the controller's secret in {address.name}: {exc}") from None
            if code == 0:
                secret = out.decode(errors="replace").strip()
                return SandboxContainer(address.id, address.name, address.host, address.port, secret)
            if time.monotonic() > deadline or self._container(address.id).status in ("exited", "dead"):
                raise SandboxError(
                    f"sandbox {address.name} wrote no controller secret in {wait_s:.0f}s:\n{self.logs(address.id, 40)}"
                )
            time.sleep(0.02)

    def _exec_within(self, ident: str, argv: list[str], user: str, timeout_s: float) -> tuple[int, bytes]:
        """``docker exec`` that gives up after ``timeout_s``: docker-py reads an exec's output with no
        timeout, and an exec into a container that is exiting can hang for good (seen under runsc). The
        reader thread is a daemon and ends when the caller removes the container."""
        answer: queue.SimpleQueue[tuple[int, bytes] | BaseException] = queue.SimpleQueue()

        def run() -> None:
            try:
                code, out = self._container(ident).exec_run(argv, user=user, stderr=False)
                answer.put((int(code), out))
            except BaseException as exc:  # handed to the caller, who re-raises it
                answer.put(exc)

        threading.Thread(target=run, name=f"corral-exec-{ident[:12]}", daemon=True).start()
        try:
            result = answer.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"exec {argv[0]} in {ident[:12]} gave no answer in {timeout_s:.1f}s") from None
        if isinstance(result, BaseException):
            raise result
        return result

    @staticmethod
    def _address(container: Container) -> SandboxContainer | None:
        settings = container.attrs.get("NetworkSettings") or {}
        bindings = (settings.get("Ports") or {}).get(f"{CONTROLLER_PORT}/tcp") or []
        if bindings:
            return SandboxContainer(container.id, container.name, "127.0.0.1", int(bindings[0]["HostPort"]))
        for network in (settings.get("Networks") or {}).values():
            if network.get("IPAddress"):
                return SandboxContainer(container.id, container.name, network["IPAddress"], CONTROLLER_PORT)
        return None

    def _network_exists(self, name: str) -> bool:
        # Docker's name filter matches substrings ("corral-egress" finds "corral-egress-test-1").
        return any(network.name == name for network in self._client.networks.list(names=[name]))

    def ensure_network(self, name: str) -> None:
        """A bridge network whose containers cannot talk to each other (inter-container traffic off)."""
        if self._network_exists(name):
            return
        try:
            self._client.networks.create(
                name,
                driver="bridge",
                options={"com.docker.network.bridge.enable_icc": "false"},
                labels={SANDBOX_LABEL: "network"},
            )
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # created meanwhile by someone else
                raise SandboxError(f"cannot create network {name}: {exc.explanation or exc}") from None

    # -- egress ----------------------------------------------------------------------------------------

    def ensure_egress_network(self, name: str) -> None:
        """The network proxies reach upstreams through (a plain bridge with NAT to the outside)."""
        if self._network_exists(name):
            return
        try:
            self._client.networks.create(name, driver="bridge", labels={SANDBOX_LABEL: NETWORK_ROLE})
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise SandboxError(f"cannot create network {name}: {exc.explanation or exc}") from None

    def _used_subnets(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        used = []
        for network in self._client.networks.list():
            for config in (network.attrs.get("IPAM") or {}).get("Config") or []:
                with contextlib.suppress(ValueError, TypeError):
                    used.append(ipaddress.ip_network(config.get("Subnet", ""), strict=False))
        return used

    def create_session_network(
        self, name: str, labels: Mapping[str, str] | None = None, pool: str = "10.213.0.0/16", prefix: int = 28
    ) -> SessionNetwork:
        """An ``--internal`` network (no route out) for one sandbox and its proxy.

        Its subnet is a small one (/28) taken from ``pool``: Docker's own default pools hold only
        about 30 networks, far fewer than the sessions a gateway may run.
        """
        used = self._used_subnets()
        for candidate in ipaddress.ip_network(pool).subnets(new_prefix=prefix):
            if any(candidate.overlaps(other) for other in used):
                continue
            ipam = docker.types.IPAMConfig(
                pool_configs=[docker.types.IPAMPool(subnet=str(candidate), gateway=str(candidate[1]))]
            )
            try:
                network = self._client.networks.create(
                    name,
                    driver="bridge",
                    internal=True,
                    ipam=ipam,
                    labels={SANDBOX_LABEL: NETWORK_ROLE, **(labels or {})},
                )
                network.reload()
            except docker.errors.APIError as exc:
                if "overlap" in str(exc.explanation or exc).lower():
                    used.append(candidate)  # taken meanwhile by another gateway or session: the next one
                    continue
                raise SandboxError(f"cannot create network {name}: {exc.explanation or exc}") from None
            return self._session_network(network.attrs)
        raise SandboxError(f"no free /{prefix} left in the session network pool {pool} (CORRAL_SESSION_SUBNETS)")

    def session_network(self, name: str) -> SessionNetwork | None:
        try:
            return self._session_network(self._client.networks.get(name).attrs)
        except docker.errors.NotFound:
            return None

    @staticmethod
    def _session_network(attrs: Mapping[str, Any]) -> SessionNetwork:
        config = ((attrs.get("IPAM") or {}).get("Config") or [{}])[0]
        options = attrs.get("Options") or {}
        interface = options.get("com.docker.network.bridge.name") or f"br-{str(attrs['Id'])[:12]}"
        subnet, gateway = str(config.get("Subnet", "")), str(config.get("Gateway", ""))
        return SessionNetwork(str(attrs["Name"]), subnet, gateway, interface)

    def network_names(self) -> list[str]:
        return [str(network.name) for network in self._client.networks.list()]

    def remove_network(self, name: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            network = self._client.networks.get(name)
            for container_id in network.attrs.get("Containers") or {}:
                with contextlib.suppress(docker.errors.APIError):
                    network.disconnect(container_id, force=True)
            network.remove()

    def start_egress(self, spec: EgressSpec) -> EgressContainer:
        """Start a session's proxy on the egress network and its session network (alias corral-proxy);
        without an egress network, on the session network alone."""
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        session_net = spec.session_network.name
        # Never Docker's default bridge: the first network is named, with the alias if it is the session's.
        first = spec.egress_network or session_net
        endpoint = (
            None
            if spec.egress_network
            else {session_net: self._client.api.create_endpoint_config(aliases=[EGRESS_ALIAS])}
        )
        try:
            container: Container = self._client.containers.create(
                spec.image,
                name=spec.name,
                labels={SANDBOX_LABEL: EGRESS_ROLE, **(spec.labels or {})},
                environment={
                    "CORRAL_SESSION_NET": spec.session_network.subnet,
                    **(spec.environment or {}),
                },
                network=first,
                networking_config=endpoint,
                volumes={str(spec.state_dir): {"bind": EGRESS_STATE, "mode": "rw"}},
                user=f"{spec.uid}:{spec.uid}",
                log_config=LOG_CONFIG,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=True,
                tmpfs={"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"},
                mem_limit=spec.memory,
                memswap_limit=spec.memory,
                nano_cpus=int(spec.cpus * 1e9),
                pids_limit=spec.pids,
                # A crashed proxy comes straight back (the gateway's watchdog covers the rest).
                restart_policy={"Name": "on-failure"},
                init=False,
            )
            if spec.egress_network:
                self._client.networks.get(session_net).connect(container, aliases=[EGRESS_ALIAS])
            container.start()
            container.reload()
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {spec.image} not found; build it with `corral images build`") from None
        except docker.errors.APIError as exc:
            self.remove(spec.name)
            raise SandboxError(f"cannot start the egress proxy: {exc.explanation or exc}") from None
        networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        address = (networks.get(spec.session_network.name) or {}).get("IPAddress")
        if not address:
            container.remove(force=True)
            raise SandboxError(f"egress proxy {spec.name} has no address on {spec.session_network.name}")
        return EgressContainer(container.id, container.name, str(address))

    def start_service(
        self,
        name: str,
        image: str,
        argv: list[str],
        network: str,
        aliases: list[str],
        volumes: Mapping[str, str],
        labels: Mapping[str, str] | None = None,
        *,
        writable: Mapping[str, str] | None = None,
        cpus: float | None = None,
        memory: str | None = None,
    ) -> str:
        """A helper container (tests' fake upstreams, the bench's); returns its address on ``network``.

        ``volumes`` are mounted read-only, ``writable`` read-write; ``cpus`` and ``memory`` limit it
        (the bench gives its bare proxy the same limits as a session's proxy)."""
        self.remove(name)
        binds = {host: {"bind": inside, "mode": "ro"} for host, inside in volumes.items()}
        binds.update({host: {"bind": inside, "mode": "rw"} for host, inside in (writable or {}).items()})
        limits: dict[str, Any] = {}
        if cpus is not None:
            limits["nano_cpus"] = int(cpus * 1e9)
        if memory is not None:
            limits.update(mem_limit=memory, memswap_limit=memory)
        try:
            container: Container = self._client.containers.create(
                image,
                argv,
                entrypoint=[],
                name=name,
                user="root",
                labels=dict(labels or {}),
                network=network,
                volumes=binds,
                init=True,
                **limits,
            )
            net = self._client.networks.get(network)
            net.disconnect(container)
            net.connect(container, aliases=aliases)
            container.start()
            container.reload()
        except docker.errors.APIError as exc:
            self.remove(name)
            raise SandboxError(f"cannot start {name}: {exc.explanation or exc}") from None
        networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        return str((networks.get(network) or {}).get("IPAddress", ""))

    def address_on(self, ident: str, network: str) -> str | None:
        """A container's address on one network (None when it has none there)."""
        networks = (self._container(ident).attrs.get("NetworkSettings") or {}).get("Networks") or {}
        address = (networks.get(network) or {}).get("IPAddress")
        return str(address) if address else None

    def remove_all(self, labels: Mapping[str, str]) -> None:
        """Every container, then every network, carrying ``labels``."""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        for container in self._client.containers.list(all=True, filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        for network in self._client.networks.list(filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                self.remove_network(network.name)

    def container_states(self, labels: Mapping[str, str]) -> dict[str, str]:
        """Name -> state ("running", "exited", "restarting", ...) of every container with ``labels``."""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        return {c.name: c.status for c in self._client.containers.list(all=True, filters=filters)}

    def sandbox_states(self, labels: Mapping[str, str]) -> dict[str, str]:
        """Container id -> state of every sandbox with ``labels``, from one listing (no inspect each:
        the reaper asks every second)."""
        wanted = {SANDBOX_LABEL: SANDBOX_ROLE, **labels}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        return {str(c.id): str(c.status) for c in self._client.containers.list(all=True, filters=filters, sparse=True)}

    def exit_info(self, ident: str) -> ExitInfo | None:
        """None while the container runs (or is paused or restarting); else how it ended."""
        try:
            attrs = self._client.api.inspect_container(ident)
        except docker.errors.NotFound:
            return ExitInfo("gone", None, False)
        state = attrs.get("State") or {}
        status = str(state.get("Status", ""))
        if state.get("Running") or status in ("running", "paused", "restarting", "created"):
            return None
        code = state.get("ExitCode")
        return ExitInfo(status or "exited", int(code) if isinstance(code, int) else None, bool(state.get("OOMKilled")))

    def session_networks(self, labels: Mapping[str, str]) -> list[SessionNetwork]:
        """Every session network carrying ``labels`` (for the gateway's reconcile on start)."""
        wanted = {SANDBOX_LABEL: NETWORK_ROLE, **labels}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        out = []
        for network in self._client.networks.list(filters=filters):
            with contextlib.suppress(KeyError, IndexError, TypeError):
                out.append(self._session_network(network.attrs))
        return out

    def restart(self, ident: str) -> None:
        try:
            self._container(ident).restart(timeout=2)
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot restart {ident}: {exc.explanation or exc}") from None

    def stop(self, ident: str) -> None:
        """Stop a container for good (Docker does not restart a container stopped by hand)."""
        with contextlib.suppress(docker.errors.APIError):
            self._container(ident).stop(timeout=1)

    def kill(self, ident: str, signal: str = "KILL") -> None:
        """Kill a container's main process (tests use it to kill a proxy mid-session)."""
        with contextlib.suppress(docker.errors.APIError):
            self._container(ident).kill(signal=signal)

    def bridge(self, name: str) -> tuple[str, str]:
        """The host interface and gateway address of a bridge network."""
        network = self._client.networks.get(name)
        options = network.attrs.get("Options") or {}
        interface = options.get("com.docker.network.bridge.name") or f"br-{network.id[:12]}"
        configs = (network.attrs.get("IPAM") or {}).get("Config") or [{}]
        return interface, str(configs[0].get("Gateway", ""))

    def list_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        """Every sandbox container (running or not) carrying ``labels``."""
        wanted = {SANDBOX_LABEL: SANDBOX_ROLE, **(labels or {})}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        out = []
        for container in self._client.containers.list(all=True, filters=filters):
            running = container.status == "running"
            address = self._address(container) if running else None
            if address is not None:
                try:
                    address = self._with_secret(address, 0)
                except SandboxError:
                    address = None  # not a sandbox this gateway can drive: treated as dead
            out.append(SandboxInfo(container.id, container.name, dict(container.labels), running, address))
        return out

    def wait_ready(self, sandbox: SandboxContainer, timeout_s: float = 60.0) -> float:
        """Block until the controller's /healthz answers 200; returns the seconds it took."""
        start = time.monotonic()
        url = f"{sandbox.base_url}/healthz"
        while True:
            signed = auth.sign(sandbox.secret) if sandbox.secret else None
            request = urllib.request.Request(url, headers=signed.headers if signed else {})
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        if signed is not None and not auth.proven(sandbox.secret, signed.nonce, response.headers):
                            raise SandboxError(f"sandbox {sandbox.name}: whatever answers on its port is no controller")
                        return time.monotonic() - start
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            try:
                state = self._container(sandbox.id).status
            except docker.errors.APIError as exc:
                raise SandboxError(f"cannot inspect sandbox {sandbox.name}: {exc}") from None
            if state in ("exited", "dead"):
                raise SandboxError(f"sandbox {sandbox.name} exited while starting:\n{self.logs(sandbox.id, 40)}")
            if time.monotonic() - start > timeout_s:
                raise SandboxError(
                    f"sandbox {sandbox.name} not ready after {timeout_s:.0f}s:\n{self.logs(sandbox.id, 40)}"
                )
            time.sleep(0.05)

    def _container(self, ident: str) -> Container:
        try:
            container: Container = self._client.containers.get(ident)
        except docker.errors.NotFound:
            raise SandboxError(f"no sandbox {ident}") from None
        return container

    def find(self, name: str) -> SandboxContainer | None:
        try:
            container: Container = self._client.containers.get(name)
        except docker.errors.NotFound:
            return None
        address = self._address(container)
        return self._with_secret(address, SECRET_WAIT_S) if address is not None else None

    def logs(self, ident: str, tail: int = 100) -> str:
        raw: bytes = self._container(ident).logs(tail=tail)
        return raw.decode(errors="replace")

    def remove(self, ident: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self._client.containers.get(ident).remove(force=True)

    def exec(self, ident: str, argv: list[str], user: str = "corral") -> tuple[int, str]:
        environment = {"DISPLAY": ":0"}
        if user != "root":
            # docker exec leaves the container's capability bounding set even to a non-root user; start
            # as root and drop to the user with nothing left, as the sandbox's own processes run.
            argv = [
                "setpriv",
                f"--reuid={user}",
                f"--regid={user}",
                "--clear-groups",
                "--inh-caps=-all",
                "--ambient-caps=-all",
                "--bounding-set=-all",
                "--",
                *argv,
            ]
            environment["HOME"] = f"/home/{user}"
        code, output = self._container(ident).exec_run(argv, user="root", environment=environment)
        return int(code), output.decode(errors="replace")

    def kill_process(self, ident: str, process_name: str, user: str = "agent") -> None:
        """Kill a process inside the sandbox by name, as its own uid (root there holds no CAP_KILL);
        tests use it to crash Chromium, which runs as the agent."""
        self.exec(ident, ["pkill", "-KILL", "-x", process_name], user=user)

    def compose(self, project_dir: Path, args: list[str]) -> None:
        """Run ``docker compose`` in ``project_dir`` (the CLI, as Compose has no SDK)."""
        result = subprocess.run(
            ["docker", "compose", *args], cwd=project_dir, check=False, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise SandboxError(f"docker compose {' '.join(args)} failed:\n{result.stderr[-2000:]}")

    def read_file(self, ident: str, path: str) -> str | None:
        """A small text file inside a container, or None when it is not there."""
        try:
            code, out = self._container(ident).exec_run(["cat", path], user="root")
        except (SandboxError, docker.errors.APIError):
            return None
        return out.decode(errors="replace").strip() if code == 0 else None
