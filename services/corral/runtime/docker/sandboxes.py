"""Sandbox containers: their hardened options, their start (with the controller's secret), their
states, how they ended, and waiting until their controller answers."""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from corral.contracts import auth
from corral.errors import SandboxError
from corral.proxy.sidecar import PROXY_ALIAS, PROXY_PORT
from corral.runtime.docker.engine import (
    _NOT_READY_EVERY_S,
    _REFUSED_EVERY_S,
    _STATE_EVERY_S,
    AGENT_UID,
    CONTROLLER_PORT,
    LOG_CONFIG,
    SANDBOX_LABEL,
    SANDBOX_ROLE,
    SECRET_WAIT_S,
    agent_tmpfs_mib,
    container_state,
)
from corral.runtime.docker.handover import Handover
from corral.runtime.types import (
    ExitInfo,
    SandboxAddress,
    SandboxInfo,
    SandboxSpec,
    SessionNetwork,
    State,
)

log = logging.getLogger(__name__)
_HEALTHZ_WAIT_MS = 1000  # within urlopen's 2 s timeout below


def sandbox_options(spec: SandboxSpec) -> dict[str, Any]:
    """``containers.run``'s options for a sandbox: hardened by default (no capabilities once
    booted, no privilege gain, read-only root, bounded resources)."""
    # Boot runs as root to set the firewall (the agent uid's rules always, egress with a proxy), write
    # the controller's secret (CHOWN) and trust, then drops to corral keeping only SETUID, SETGID
    # and SETPCAP for the supervisor, which starts every child with none (corral.sandbox.startup.boot).
    caps = ["SETUID", "SETGID", "SETPCAP", "CHOWN", "NET_ADMIN", "NET_RAW"]
    network = spec.session_network.name if spec.session_network is not None else spec.network
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
            **session_environment(spec.session_network),
            **(spec.environment or {}),
        },
        **placement,
        "user": "root",
        "cap_drop": ["ALL"],
        "cap_add": caps,
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "tmpfs": _tmpfs(sizes, spec.workspace_mount is None),
        "volumes": {
            **{host: {"bind": inside, "mode": "ro"} for host, inside in (spec.files or {}).items()},
            # A volume: its host mount is nosuid,nodev already, and a bind keeps its mount's flags.
            **({spec.workspace_mount: {"bind": "/workspace", "mode": "rw"}} if spec.workspace_mount else {}),
        },
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


def _tmpfs(sizes: Mapping[str, int], workspace: bool) -> dict[str, str]:
    """The sandbox's tmpfs mounts; /workspace among them unless a volume takes its place."""
    agent_owned = f"uid={AGENT_UID},gid={AGENT_UID}"
    mounts = {
        "/tmp": f"rw,nosuid,nodev,size={sizes['/tmp']}m,mode=1777",
        "/home/corral": "rw,nosuid,nodev,size=64m,uid=1000,gid=1000,mode=0700",
        # exec: what the agent installs there (pip's and npm's ~/.local/bin) must run. 0750: the
        # browser (in the agent's group) saves downloads in it and reads what a page uploads.
        "/home/agent": f"rw,nosuid,nodev,exec,size={sizes['/home/agent']}m,{agent_owned},mode=0750",
        "/run": "rw,nosuid,nodev,noexec,size=8m,mode=0755",
        "/etc/ssl/certs": "rw,nosuid,nodev,noexec,size=8m,mode=0755",
    }
    if workspace:
        mounts["/workspace"] = f"rw,nosuid,nodev,exec,size={sizes['/workspace']}m,{agent_owned},mode=0755"
    return mounts


def session_environment(network: SessionNetwork | None) -> dict[str, str]:
    """What a sandbox behind a proxy is told: where the proxy answers, and its network (its
    firewall lets nothing else out)."""
    if network is None:
        return {}
    return {
        "CORRAL_PROXY": f"{PROXY_ALIAS}:{PROXY_PORT}",
        "CORRAL_SESSION_NET": network.subnet,
        "CORRAL_SESSION_GATEWAY": network.gateway,
    }


def controller_address(container: Container) -> SandboxAddress | None:
    settings = container.attrs.get("NetworkSettings") or {}
    bindings = (settings.get("Ports") or {}).get(f"{CONTROLLER_PORT}/tcp") or []
    if bindings:
        return SandboxAddress(container.id, container.name, "127.0.0.1", int(bindings[0]["HostPort"]))
    for network in (settings.get("Networks") or {}).values():
        if network.get("IPAddress"):
            return SandboxAddress(container.id, container.name, network["IPAddress"], CONTROLLER_PORT)
    return None


class Sandboxes(Handover):
    """A container per sandbox: started hardened, listed, watched until ready."""

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        self._hand_to_controller(spec.files or {})
        with self._given_secret() as given:
            options = sandbox_options(spec) if given is None else given.options(sandbox_options(spec))
            try:
                container: Container = self.client.containers.run(spec.image, detach=True, **options)
            except docker.errors.ImageNotFound:
                raise SandboxError(f"image {spec.image} not found; build it with `corral images build`") from None
            except docker.errors.APIError as exc:
                raise SandboxError(f"cannot start a sandbox: {exc.explanation or exc}") from None
        try:
            container.reload()
        except docker.errors.APIError:
            container.remove(force=True)
            raise SandboxError(f"sandbox {container.name} vanished while starting") from None
        address = controller_address(container)
        if address is None:
            container.remove(force=True)
            raise SandboxError(f"sandbox {container.name} started without a reachable address")
        if given is not None:  # boot checks it, and the controller answers /healthz only once it runs
            return SandboxAddress(address.id, address.name, address.host, address.port, given.secret)
        try:
            return self.read_secret(address, SECRET_WAIT_S)
        except SandboxError:
            container.remove(force=True)
            raise

    def sandbox_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        """Container id -> state of every sandbox with ``labels``, from one listing (no inspect each:
        the reaper asks every second)."""
        wanted = {SANDBOX_LABEL: SANDBOX_ROLE, **labels}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        listed = self.client.containers.list(all=True, filters=filters, sparse=True)
        return {str(c.id): container_state(str(c.status)) for c in listed}

    def exit_info(self, ident: str) -> ExitInfo | None:
        """None while the container runs (or is paused or restarting); else how it ended."""
        try:
            attrs = self.client.api.inspect_container(ident)
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
        for container in self.client.containers.list(all=True, filters=filters):
            running = container.status == "running"
            address = controller_address(container) if running else None
            if address is not None:
                try:
                    address = self.read_secret(address, 0)
                except SandboxError:
                    address = None  # not a sandbox this gateway can drive: treated as dead
            out.append(SandboxInfo(container.id, container.name, dict(container.labels), running, address))
        return out

    def wait_ready(self, sandbox: SandboxAddress, timeout_s: float = 60.0) -> float:
        """Block until the controller's /healthz answers 200; returns the seconds it took."""
        start = time.monotonic()
        # Held by the controller until its first page is open (a controller of an older image answers
        # at once, and is polled as before).
        url = f"{sandbox.base_url}/healthz?wait_ms={_HEALTHZ_WAIT_MS}"
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
