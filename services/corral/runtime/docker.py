"""The one module that talks to Docker: images, sandbox containers, their networks, their egress
proxies and the host guard on their bridges; the Docker driver of :class:`~corral.runtime.SandboxRuntime`.

Everything here goes through the docker SDK (no ``docker`` CLI strings), but for ``docker compose``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import Any, get_args

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from corral.contracts import auth
from corral.errors import ImageBuildError, SandboxError
from corral.proxy.sidecar import PROXY_ALIAS, PROXY_PORT
from corral.runtime import hostguard
from corral.runtime.types import (
    SESSION_LABEL,
    ExitInfo,
    ProxyAddress,
    ProxySpec,
    SandboxAddress,
    SandboxInfo,
    SandboxSpec,
    SessionNetwork,
    State,
)

log = logging.getLogger(__name__)

SANDBOX_LABEL = "corral.role"
SANDBOX_ROLE = "sandbox"
EGRESS_ROLE = "egress"
NETWORK_ROLE = "network"
CONTROLLER_PORT = 8765
EGRESS_STATE = "/var/lib/corral-egress"  # where the proxy keeps its CA, policy and audit log
EGRESS_UID = 1001  # the proxies' uid under a root gateway unless CORRAL_EGRESS_UID says otherwise
# Containers log to Docker's json-file driver: at most this much each, so a chatty or hostile
# sandbox cannot fill the host's disk through its logs.
LOG_CONFIG = {"type": "json-file", "config": {"max-size": "10m", "max-file": "3"}}
CONTROLLER_USER = "corral"  # the sandbox's controller uid; the only one that reads its secrets
CONTROLLER_UID = 1000
AGENT_UID = 1100  # the sandbox's agent uid: Chromium, and what the agent runs
SECRET_WAIT_S = 10.0  # boot writes the secret within its first tenth of a second
_REFUSED_EVERY_S = 0.02  # /healthz tried this often while the controller's port refuses
_NOT_READY_EVERY_S = 0.05  # ... and while it answers "not yet" (its screen or Chromium still starting)
_STATE_EVERY_S = 0.25  # ... and its container's state read this often
_INIT_LOGS = b"corral.init: "  # any line of the init's: boot, which writes the secret, has handed over

LineSink = Callable[[str], None]


# The agent's tmpfs mounts hold their files in the sandbox's memory, charged to its cgroup and freed by
# no OOM kill: filled, they would leave nothing for the controller, Chromium and X, which the kernel
# would then kill again and again. Together (with /dev/shm, Chromium's and the agent's alike) they get
# the session's memory less this headroom (at least MIN_HEADROOM_MIB, else a quarter of it); the sizes
# asked are cut in proportion when they do not fit (each at least MIN_TMPFS_MIB).
MIN_HEADROOM_MIB = 512
MIN_TMPFS_MIB = 16
AGENT_HOME_SIZE = "512m"
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def mebibytes(size: str) -> int:
    """Docker's size text (``2g``, ``512m``, ``1024k``, bytes) in whole MiB."""
    text = size.strip().lower()
    unit = text[-1] if text and text[-1] in _UNITS else ""
    number = text[: len(text) - len(unit)] if unit else text
    if not number.isdigit():
        raise ValueError(f"not a size: {size!r}")
    return int(number) * _UNITS[unit] >> 20


def agent_tmpfs_mib(spec: SandboxSpec) -> dict[str, int]:
    """The size in MiB of each tmpfs the agent can write (``/dev/shm`` included): as ``spec`` asks when
    they fit the session's memory less its headroom, else cut in proportion (``/dev/shm`` first kept
    whole, since Chromium draws through it, up to half the room)."""
    memory = mebibytes(spec.memory)
    room = max(memory - max(MIN_HEADROOM_MIB, memory // 4), 4 * MIN_TMPFS_MIB)
    shm = max(MIN_TMPFS_MIB, min(mebibytes(spec.shm_size), room // 2, room - 3 * MIN_TMPFS_MIB))
    asked = {"/tmp": spec.tmp_size, "/home/agent": AGENT_HOME_SIZE, "/workspace": spec.workspace_size}
    wanted = {path: mebibytes(size) for path, size in asked.items()}
    left = room - shm
    total = sum(wanted.values())
    if total > left:  # each its floor, and what is left over in proportion
        spare = left - MIN_TMPFS_MIB * len(wanted)
        wanted = {path: MIN_TMPFS_MIB + size * spare // total for path, size in wanted.items()}
    return {**wanted, "/dev/shm": shm}


def session_network_name(session_id: str) -> str:
    return f"corral-net-{session_id}"


def proxy_name(session_id: str) -> str:
    return f"corral-egress-{session_id}"


def default_proxy_uid(setting: int | None, euid: int) -> int:
    """The host uid proxies run as: CORRAL_EGRESS_UID; unset, EGRESS_UID under a root gateway, else
    the gateway's own uid (only root can give a state directory to another user)."""
    if setting is not None:
        return setting
    return EGRESS_UID if euid == 0 else euid


def remapped_root(info: Mapping[str, Any]) -> int:
    """The host uid a container's root is under the engine's ``userns-remap`` (0 without it): the
    engine names its data root after the mapping it uses (``/var/lib/docker/100000.100000``)."""
    options = info.get("SecurityOptions") or []
    if not any(str(option).startswith("name=userns") for option in options):
        return 0
    uid, _, _gid = PurePath(str(info.get("DockerRootDir", ""))).name.partition(".")
    if not uid.isdigit():
        raise SandboxError(f"the engine remaps users but its data root names no mapping: {info.get('DockerRootDir')!r}")
    return int(uid)


def hand_over(root: Path, uid: int) -> None:
    """``root`` and everything in it to ``uid`` (and its group), links themselves rather than what
    they point at: what a container runs as must own what is mounted for it."""
    os.chown(root, uid, uid, follow_symlinks=False)
    for directory, subdirs, files in os.walk(root):
        for name in [*subdirs, *files]:
            os.chown(Path(directory) / name, uid, uid, follow_symlinks=False)


def _state(status: str) -> State:
    known: tuple[State, ...] = get_args(State)
    for state in known:
        if state == status:
            return state
    return "dead"  # a state Docker does not have today: nothing that runs


def _address_on(container: Container, network: str) -> str:
    """A container's address on one network ("" when it has none there)."""
    networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
    return str((networks.get(network) or {}).get("IPAddress") or "")


def _interface(attrs: Mapping[str, Any]) -> str:
    """The host interface of a bridge network (what the host guard's rules name)."""
    options = attrs.get("Options") or {}
    return str(options.get("com.docker.network.bridge.name") or f"br-{str(attrs['Id'])[:12]}")


class _LogWatch:
    """One container's log followed (on the caller's thread of choice) until one of ``marks`` shows,
    the log ends or ``stop``: even the opening happens on that thread, since a daemon that hangs
    would hold it past any deadline."""

    def __init__(self, client: docker.DockerClient, ident: str, marks: tuple[bytes, ...]) -> None:
        self._client, self._ident, self._marks = client, ident, marks
        self._lock = threading.Lock()
        self._stream: Any = None
        self._stopped = False
        self.seen: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def run(self) -> None:
        try:
            stream = self._client.api.logs(self._ident, stream=True, follow=True)
        except Exception:  # refused, or no daemon to ask (docker-py raises requests' errors as well)
            self.seen.put(False)
            return
        with self._lock:
            self._stream, stopped = stream, self._stopped
        if stopped:  # opened after the caller gave up
            _close_quietly(stream)
            self.seen.put(False)
            return
        tail = b""
        try:
            for chunk in stream:
                tail = (tail + chunk)[-4096:]  # a mark may be split across chunks
                if any(mark in tail for mark in self._marks):
                    self.seen.put(True)
                    return
        except Exception:  # closed under it by stop, or the daemon went away
            pass
        self.seen.put(False)

    def stop(self) -> None:
        with self._lock:
            self._stopped, stream = True, self._stream
        if stream is not None:
            _close_quietly(stream)


def _close_quietly(stream: Any) -> None:
    """Close a followed log that may have ended already or lost its daemon (over SSH, docker-py's
    close raises its own error)."""
    with contextlib.suppress(OSError, AttributeError, docker.errors.DockerException):
        stream.close()


class DockerRuntime:
    """The Docker driver: a container per sandbox and per proxy, a bridge network per session, the
    host guard as iptables rules on the bridges."""

    def __init__(self, client: docker.DockerClient | None = None, *, proxy_uid: int | None = None) -> None:
        self.proxy_uid = default_proxy_uid(proxy_uid, os.geteuid())
        try:
            self._client = client or docker.from_env()
            # What a container's uid is on the host: the same number, or shifted by userns-remap
            # (docs/userns.md); every file handed to a container's uid is chowned to that.
            self.host_root = remapped_root(self._client.info())
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

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        self._hand_to_controller(spec.files or {})
        try:
            container: Container = self._client.containers.run(spec.image, detach=True, **self._sandbox_options(spec))
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

    def _sandbox_options(self, spec: SandboxSpec) -> dict[str, Any]:
        """``containers.run``'s options for a sandbox: hardened by default (no capabilities once
        booted, no privilege gain, read-only root, bounded resources)."""
        # Boot runs as root to set the firewall (the agent uid's rules always, egress with a proxy), write
        # the controller's secret (CHOWN) and trust, then drops to corral keeping only SETUID, SETGID
        # and SETPCAP for the supervisor, which starts every child with none (corral.sandbox.startup.boot).
        caps = ["SETUID", "SETGID", "SETPCAP", "CHOWN", "NET_ADMIN", "NET_RAW"]
        network = spec.session_network.name if spec.session_network is not None else spec.network
        agent_owned = f"uid={AGENT_UID},gid={AGENT_UID}"
        sizes = agent_tmpfs_mib(spec)
        placement: dict[str, Any] = (
            {"network": network} if network else {"ports": {f"{CONTROLLER_PORT}/tcp": ("127.0.0.1", spec.host_port)}}
        )
        return {
            "name": spec.name,
            "labels": {SANDBOX_LABEL: SANDBOX_ROLE, **(spec.labels or {})},
            # A sandbox Corral starts never runs without its inner boundary (corral.sandbox.startup.boot).
            "environment": {
                "CORRAL_SCREEN": spec.screen,
                "CORRAL_INNER_BOUNDARY": "required",
                **self._session_environment(spec.session_network),
                **(spec.environment or {}),
            },
            **placement,
            "user": "root",
            "cap_drop": ["ALL"],
            "cap_add": caps,
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {
                "/tmp": f"rw,nosuid,nodev,size={sizes['/tmp']}m,mode=1777",
                "/home/corral": "rw,nosuid,nodev,size=64m,uid=1000,gid=1000,mode=0700",
                # exec: what the agent installs there (pip's and npm's ~/.local/bin) must run. 0750: the
                # browser (in the agent's group) saves downloads in it and reads what a page uploads.
                "/home/agent": f"rw,nosuid,nodev,exec,size={sizes['/home/agent']}m,{agent_owned},mode=0750",
                "/workspace": f"rw,nosuid,nodev,exec,size={sizes['/workspace']}m,{agent_owned},mode=0755",
                "/run": "rw,nosuid,nodev,noexec,size=8m,mode=0755",
                "/etc/ssl/certs": "rw,nosuid,nodev,noexec,size=8m,mode=0755",
            },
            "volumes": {host: {"bind": inside, "mode": "ro"} for host, inside in (spec.files or {}).items()},
            "shm_size": f"{sizes['/dev/shm']}m",
            "mem_limit": spec.memory,
            "memswap_limit": spec.memory,
            "nano_cpus": int(spec.cpus * 1e9),
            "pids_limit": spec.pids,
            "init": False,  # the image runs tini itself
            # Docker runs a healthcheck as the container's user (root, for the boot stage) with the
            # sandbox user's home as its working directory: never. The gateway polls /healthz itself.
            "healthcheck": {"test": ["NONE"]},
            "log_config": LOG_CONFIG,
            "runtime": spec.runtime,
        }

    @staticmethod
    def _session_environment(network: SessionNetwork | None) -> dict[str, str]:
        """What a sandbox behind a proxy is told: where the proxy answers, and its network (its
        firewall lets nothing else out)."""
        if network is None:
            return {}
        return {
            "CORRAL_PROXY": f"{PROXY_ALIAS}:{PROXY_PORT}",
            "CORRAL_SESSION_NET": network.subnet,
            "CORRAL_SESSION_GATEWAY": network.gateway,
        }

    def _hand_to_controller(self, files: Mapping[str, str]) -> None:
        """Files mounted into a sandbox are its controller's uid's to read (0600, read-only mount):
        the agent's uid cannot."""
        if not files:
            return
        if os.geteuid() != 0:
            log.warning("not root: the sandbox's controller cannot read what is mounted for it (%s)", ", ".join(files))
            return
        for host in files:
            owner = self.host_root + CONTROLLER_UID
            os.chown(host, owner, owner, follow_symlinks=False)

    def _with_secret(self, address: SandboxAddress, wait_s: float) -> SandboxAddress:
        """The address with its controller's per-boot secret, read inside the container as the
        controller's uid (the only one that may read it), the moment boot has written it."""
        deadline = time.monotonic() + wait_s
        # One exec, once boot says the file is there; an image whose boot does not say so is read when
        # its init logs (boot is done by then), or by the retries below when neither shows.
        if wait_s > 0:
            self._wait_for_log(address.id, (auth.SECRET_WRITTEN.encode(), _INIT_LOGS), wait_s)
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
                return SandboxAddress(address.id, address.name, address.host, address.port, secret)
            if time.monotonic() > deadline or self._container(address.id).status in ("exited", "dead"):
                raise SandboxError(
                    f"sandbox {address.name} wrote no controller secret in {wait_s:.0f}s:\n{self.logs(address.id, 40)}"
                )
            time.sleep(0.02)

    def _wait_for_log(self, ident: str, marks: tuple[bytes, ...], timeout_s: float) -> bool:
        """Whether the container's log shows one of ``marks`` within ``timeout_s``; False at the log's
        end (the container stopped), the deadline, or a daemon that will not follow it. A hint of when
        to look, never trusted for more: what the log says is checked by whatever the caller does next."""
        watch = _LogWatch(self._client, ident, marks)
        threading.Thread(target=watch.run, name=f"corral-log-{ident[:12]}", daemon=True).start()
        try:
            return watch.seen.get(timeout=timeout_s)
        except queue.Empty:
            return False
        finally:
            watch.stop()

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
    def _address(container: Container) -> SandboxAddress | None:
        settings = container.attrs.get("NetworkSettings") or {}
        bindings = (settings.get("Ports") or {}).get(f"{CONTROLLER_PORT}/tcp") or []
        if bindings:
            return SandboxAddress(container.id, container.name, "127.0.0.1", int(bindings[0]["HostPort"]))
        for network in (settings.get("Networks") or {}).values():
            if network.get("IPAddress"):
                return SandboxAddress(container.id, container.name, network["IPAddress"], CONTROLLER_PORT)
        return None

    # -- shared networks -------------------------------------------------------------------------------

    def _network_exists(self, name: str) -> bool:
        # Docker's name filter matches substrings ("corral-egress" finds "corral-egress-test-1").
        return any(network.name == name for network in self._client.networks.list(names=[name]))

    def _guard(self, name: str) -> bool:
        """The host guard on a network's bridge (idempotent); False when the host does not allow it."""
        return hostguard.install(_interface(self._client.networks.get(name).attrs))

    def ensure_sandbox_network(self, name: str) -> bool:
        """A bridge network whose containers cannot talk to each other (inter-container traffic off),
        guarded: nothing on it reaches the host's own services."""
        if not self._network_exists(name):
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
        return self._guard(name)

    def ensure_egress_network(self, name: str) -> bool:
        """The network proxies reach upstreams through (a plain bridge with NAT to the outside),
        guarded: proxies reach upstreams through it, never the host's own services."""
        if os.geteuid() != 0 and self.host_root + self.proxy_uid != os.geteuid():
            raise SandboxError(
                f"CORRAL_EGRESS_UID={self.proxy_uid} needs a gateway running as root (to give the proxies their state)"
            )
        if not self._network_exists(name):
            try:
                self._client.networks.create(name, driver="bridge", labels={SANDBOX_LABEL: NETWORK_ROLE})
            except docker.errors.APIError as exc:
                if exc.status_code != 409:
                    raise SandboxError(f"cannot create network {name}: {exc.explanation or exc}") from None
        return self._guard(name)

    def remove_stale_guards(self) -> list[str]:
        # Any gateway's: the bridge names are unique and a rule on a missing interface guards nothing.
        return hostguard.remove_stale()

    def remove_network(self, name: str) -> None:
        """A network (its containers disconnected first) and its host guard. A network already gone
        leaves no name for its bridge: then every guard whose interface is gone goes (its own among them)."""
        try:
            network = self._client.networks.get(name)
        except docker.errors.NotFound:
            hostguard.remove_stale()
            return
        for container_id in network.attrs.get("Containers") or {}:
            with contextlib.suppress(docker.errors.APIError):
                network.disconnect(container_id, force=True)
        with contextlib.suppress(docker.errors.NotFound):
            network.remove()
        hostguard.remove(_interface(network.attrs))

    # -- session networks ------------------------------------------------------------------------------

    def _used_subnets(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        used = []
        for network in self._client.networks.list():
            for config in (network.attrs.get("IPAM") or {}).get("Config") or []:
                with contextlib.suppress(ValueError, TypeError):
                    used.append(ipaddress.ip_network(config.get("Subnet", ""), strict=False))
        return used

    def create_session_network(
        self, session_id: str, labels: Mapping[str, str], subnets: str = "10.213.0.0/16", prefix: int = 28
    ) -> SessionNetwork:
        """An ``--internal`` network (no route out) for one sandbox and its proxy, guarded.

        Its subnet is a small one (/28) taken from ``subnets``: Docker's own default pools hold only
        about 30 networks, far fewer than the sessions a gateway may run.
        """
        name = session_network_name(session_id)
        used = self._used_subnets()
        for candidate in ipaddress.ip_network(subnets).subnets(new_prefix=prefix):
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
                    labels={SANDBOX_LABEL: NETWORK_ROLE, **labels, SESSION_LABEL: session_id},
                )
                network.reload()
            except docker.errors.APIError as exc:
                if "overlap" in str(exc.explanation or exc).lower():
                    used.append(candidate)  # taken meanwhile by another gateway or session: the next one
                    continue
                raise SandboxError(f"cannot create network {name}: {exc.explanation or exc}") from None
            # The internal network still reaches the host through its bridge address: closed here too.
            if not hostguard.install(_interface(network.attrs)):
                log.error("no host guard on %s: the sandbox's own firewall is the only barrier", name)
            return self._session_network(network.attrs)
        raise SandboxError(f"no free /{prefix} left in the session network pool {subnets} (CORRAL_SESSION_SUBNETS)")

    @staticmethod
    def _session_network(attrs: Mapping[str, Any]) -> SessionNetwork:
        config = ((attrs.get("IPAM") or {}).get("Config") or [{}])[0]
        return SessionNetwork(str(attrs["Name"]), str(config.get("Subnet", "")), str(config.get("Gateway", "")))

    def session_networks(self, labels: Mapping[str, str]) -> list[SessionNetwork]:
        """Every session network carrying ``labels`` (for the gateway's reconcile on start)."""
        wanted = {SANDBOX_LABEL: NETWORK_ROLE, **labels}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        out = []
        for network in self._client.networks.list(filters=filters):
            with contextlib.suppress(KeyError, IndexError, TypeError):
                out.append(self._session_network(network.attrs))
        return out

    def remove_session_network(self, network: SessionNetwork) -> None:
        self.remove_network(network.name)

    # -- egress pairs ----------------------------------------------------------------------------------

    def start_proxy(self, spec: ProxySpec) -> ProxyAddress:
        """Start a session's proxy on the egress network and its session network (alias corral-proxy);
        without an egress network, on the session network alone. Its state directory becomes its uid's."""
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        if self.host_root + self.proxy_uid != os.geteuid():
            hand_over(spec.state_dir, self.host_root + self.proxy_uid)
        name, session_net = proxy_name(spec.session_id), spec.network.name
        try:
            container: Container = self._client.containers.create(spec.image, **self._proxy_options(spec, name))
            if spec.egress_network:
                self._client.networks.get(session_net).connect(container, aliases=[PROXY_ALIAS])
            container.start()
            container.reload()
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {spec.image} not found; build it with `corral images build`") from None
        except docker.errors.APIError as exc:
            self.remove(name)
            raise SandboxError(f"cannot start the egress proxy: {exc.explanation or exc}") from None
        address = _address_on(container, session_net)
        if not address:
            container.remove(force=True)
            raise SandboxError(f"egress proxy {name} has no address on {session_net}")
        return ProxyAddress(container.id, container.name, address)

    def _proxy_options(self, spec: ProxySpec, name: str) -> dict[str, Any]:
        """``containers.create``'s options for a proxy: its own uid, no capabilities, read-only root."""
        session_net = spec.network.name
        # Never Docker's default bridge: the first network is named, with the alias if it is the session's.
        endpoint = (
            None
            if spec.egress_network
            else {session_net: self._client.api.create_endpoint_config(aliases=[PROXY_ALIAS])}
        )
        return {
            "name": name,
            "labels": {SANDBOX_LABEL: EGRESS_ROLE, **(spec.labels or {}), SESSION_LABEL: spec.session_id},
            "environment": {"CORRAL_SESSION_NET": spec.network.subnet, **(spec.environment or {})},
            "network": spec.egress_network or session_net,
            "networking_config": endpoint,
            "volumes": {str(spec.state_dir): {"bind": EGRESS_STATE, "mode": "rw"}},
            "user": f"{self.proxy_uid}:{self.proxy_uid}",
            "log_config": LOG_CONFIG,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"},
            "mem_limit": spec.memory,
            "memswap_limit": spec.memory,
            "nano_cpus": int(spec.cpus * 1e9),
            "pids_limit": spec.pids,
            # A crashed proxy comes straight back (the gateway's watchdog covers the rest).
            "restart_policy": {"Name": "on-failure"},
            "init": False,
        }

    def proxy_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        """Session id -> state of every proxy with ``labels``, from one listing."""
        wanted = {SANDBOX_LABEL: EGRESS_ROLE, **labels}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        states: dict[str, State] = {}
        for container in self._client.containers.list(all=True, filters=filters, sparse=True):
            session_id = (container.attrs.get("Labels") or {}).get(SESSION_LABEL)
            if session_id:
                states[str(session_id)] = _state(str(container.status))
        return states

    def restart_proxy(self, session_id: str) -> ProxyAddress:
        name = proxy_name(session_id)
        try:
            container = self._container(name)
            container.restart(timeout=2)
            container.reload()
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot restart {name}: {exc.explanation or exc}") from None
        return ProxyAddress(container.id, container.name, _address_on(container, session_network_name(session_id)))

    def proxy_logs(self, session_id: str, tail: int = 100) -> str:
        return self.logs(proxy_name(session_id), tail)

    def remove_egress(self, session_id: str, *, drain: bool = False) -> None:
        name = proxy_name(session_id)
        if drain:
            # SIGTERM first: mitmdump's shutdown writes out the responses still queued for the file.
            with contextlib.suppress(SandboxError, docker.errors.APIError):
                self._container(name).stop(timeout=1)
        self.remove(name)
        self.remove_network(session_network_name(session_id))

    def remove_all(self, labels: Mapping[str, str]) -> None:
        """Every container, then every network, carrying ``labels``."""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        for container in self._client.containers.list(all=True, filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        for network in self._client.networks.list(filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                self.remove_network(network.name)

    def sandbox_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        """Container id -> state of every sandbox with ``labels``, from one listing (no inspect each:
        the reaper asks every second)."""
        wanted = {SANDBOX_LABEL: SANDBOX_ROLE, **labels}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        listed = self._client.containers.list(all=True, filters=filters, sparse=True)
        return {str(c.id): _state(str(c.status)) for c in listed}

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

    def wait_ready(self, sandbox: SandboxAddress, timeout_s: float = 60.0) -> float:
        """Block until the controller's /healthz answers 200; returns the seconds it took."""
        start = time.monotonic()
        url = f"{sandbox.base_url}/healthz"
        looked = start  # when the container's state was last read
        while True:
            signed = auth.sign(sandbox.secret) if sandbox.secret else None
            request = urllib.request.Request(url, headers=signed.headers if signed else {})
            pause = _REFUSED_EVERY_S
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        if signed is not None and not auth.proven(sandbox.secret, signed.nonce, response.headers):
                            raise SandboxError(f"sandbox {sandbox.name}: whatever answers on its port is no controller")
                        return time.monotonic() - start
            except urllib.error.HTTPError as exc:
                exc.close()
                pause = _NOT_READY_EVERY_S  # the controller answers: each try is its work too
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            # A try before the controller listens is a refused connection (or, on a published port,
            # one docker-proxy accepts and drops): cheap. An inspect is the daemon's CPU while the
            # sandbox boots on the same cores. So the port is tried often (each pause is latency
            # added to a cold start), the container's state now and then.
            if time.monotonic() - looked >= _STATE_EVERY_S:
                looked = time.monotonic()
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
            time.sleep(pause)

    def _container(self, ident: str) -> Container:
        try:
            container: Container = self._client.containers.get(ident)
        except docker.errors.NotFound:
            raise SandboxError(f"no sandbox {ident}") from None
        return container

    def logs(self, ident: str, tail: int = 100) -> str:
        raw: bytes = self._container(ident).logs(tail=tail)
        return raw.decode(errors="replace")

    def remove(self, ident: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self._client.containers.get(ident).remove(force=True)

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
