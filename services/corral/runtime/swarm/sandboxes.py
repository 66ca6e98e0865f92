"""Sandboxes as Swarm services, one task each (restart condition none: a dead task ends its session,
Swarm never runs it again): their hardened spec, their start with the controller's secret given as
a Swarm secret, their states and how they ended (with their node, and ``node_lost``), and waiting
until their controller answers."""

from __future__ import annotations

import logging
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import docker
import docker.errors
import docker.types

from corral.contracts import auth
from corral.errors import NotOnThisRuntime, SandboxError
from corral.runtime.docker.engine import (
    AGENT_UID,
    CONTROLLER_PORT,
    CONTROLLER_UID,
    SANDBOX_LABEL,
    SANDBOX_ROLE,
    agent_tmpfs_mib,
    mebibytes,
)
from corral.runtime.docker.sandboxes import session_environment
from corral.runtime.swarm.engine import (
    exit_of,
    newest_task,
    runtime_state,
    task_address,
    task_error,
    task_state,
)
from corral.runtime.swarm.secrets import OWNER_LABEL, GivenFile, SwarmSecrets
from corral.runtime.types import ExitInfo, SandboxAddress, SandboxInfo, SandboxSpec, State

log = logging.getLogger(__name__)

# What boot needs as root, as the docker driver grants it (corral.runtime.docker.sandboxes).
CAPABILITIES = ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_CHOWN", "CAP_NET_ADMIN", "CAP_NET_RAW"]
LOG_DRIVER = docker.types.DriverConfig("json-file", {"max-size": "10m", "max-file": "3"})


def one_task(
    container: docker.types.ContainerSpec,
    cpus: float,
    memory: str,
    pids: int,
    constraints: Sequence[str],
    networks: list[docker.types.NetworkAttachmentConfig],
) -> docker.types.TaskTemplate:
    """The task of a sandbox's or a proxy's service: its limits (CPU, memory, pids), its placement,
    capped json-file logs, and restart condition none: a task Swarm restarted by itself would come
    back at an address the gateway does not know (a sandbox as a new, empty desktop); the gateway ends
    the session or, for a proxy, restarts it itself (restart_proxy)."""
    resources = docker.types.Resources(cpu_limit=int(cpus * 1e9), mem_limit=mebibytes(memory) << 20)
    resources["Limits"]["Pids"] = pids
    return docker.types.TaskTemplate(
        container,
        resources=resources,
        restart_policy=docker.types.RestartPolicy(condition="none"),
        placement=docker.types.Placement(constraints=list(constraints)) if constraints else None,
        log_driver=LOG_DRIVER,
        networks=networks,
    )


_TASK_EVERY_S = 0.25
_REFUSED_EVERY_S = 0.05


def _tmpfs_volume(target: str, options: str) -> docker.types.Mount:
    """A tmpfs the node's ``local`` volume driver mounts for the task (anonymous: gone with it). Not
    Swarm's own tmpfs mount, which takes no uid and is always noexec on Docker 20.10: the agent runs
    what it installs in its home and /workspace, as it does on one host."""
    return docker.types.Mount(
        target,
        None,
        type="volume",
        driver_config=docker.types.DriverConfig("local", {"type": "tmpfs", "device": "tmpfs", "o": options}),
    )


def sandbox_mounts(spec: SandboxSpec) -> list[docker.types.Mount]:
    """The docker driver's tmpfs mounts (corral.runtime.docker.sandboxes._tmpfs), their sizes as it
    sizes them, and /dev/shm sized as its ``shm_size`` (a service has no shm size on Docker 20.10)."""
    if spec.workspace_mount is not None:
        raise NotOnThisRuntime(
            "workspace volumes: not on the swarm driver (CORRAL_RUNTIME=swarm): loop devices of one host"
        )
    sizes = agent_tmpfs_mib(spec)
    agent = f"uid={AGENT_UID},gid={AGENT_UID}"
    return [
        _tmpfs_volume("/tmp", f"nosuid,nodev,size={sizes['/tmp']}m,mode=1777"),
        _tmpfs_volume("/home/corral", f"nosuid,nodev,size=64m,uid={CONTROLLER_UID},gid={CONTROLLER_UID},mode=0700"),
        _tmpfs_volume("/home/agent", f"nosuid,nodev,exec,size={sizes['/home/agent']}m,{agent},mode=0750"),
        _tmpfs_volume("/workspace", f"nosuid,nodev,exec,size={sizes['/workspace']}m,{agent},mode=0755"),
        _tmpfs_volume("/run", "nosuid,nodev,noexec,size=8m,mode=0755"),
        _tmpfs_volume("/etc/ssl/certs", "nosuid,nodev,noexec,size=8m,mode=0755"),
        docker.types.Mount("/dev/shm", None, type="tmpfs", tmpfs_size=sizes["/dev/shm"] << 20, tmpfs_mode=0o1777),
    ]


def sandbox_labels(spec: SandboxSpec) -> dict[str, str]:
    return {SANDBOX_LABEL: SANDBOX_ROLE, **(spec.labels or {})}


def sandbox_service(
    spec: SandboxSpec, name: str, refs: list[docker.types.SecretReference], constraints: tuple[str, ...]
) -> dict[str, Any]:
    """``create_service``'s arguments for a sandbox: the docker driver's hardening where Swarm has it
    (no capabilities but boot's, read-only root, bounded resources and logs), boot doing the rest
    (no_new_privs, the secret it is given)."""
    network = spec.session_network.name if spec.session_network is not None else spec.network
    if not network:
        raise SandboxError("swarm driver: a sandbox needs a network (it publishes no port on a node)")
    if spec.runtime:
        raise NotOnThisRuntime(
            f"an OCI runtime of its own ({spec.runtime}): not on the swarm driver (CORRAL_RUNTIME=swarm)"
        )
    env = {
        "CORRAL_SCREEN": spec.screen,
        "CORRAL_INNER_BOUNDARY": "required",
        "CORRAL_SECRET_GIVEN": "1",
        **session_environment(spec.session_network),
        **(spec.environment or {}),
    }
    labels = sandbox_labels(spec)
    container = docker.types.ContainerSpec(
        spec.image,
        env=env,
        user="root",
        labels=labels,
        mounts=sandbox_mounts(spec),
        secrets=refs,
        read_only=True,
        healthcheck=docker.types.Healthcheck(test=["NONE"]),
        cap_add=CAPABILITIES,
        cap_drop=["ALL"],
        stop_grace_period=2_000_000_000,
    )
    template = one_task(
        container, spec.cpus, spec.memory, spec.pids, constraints, [docker.types.NetworkAttachmentConfig(network)]
    )
    return {
        "task_template": template,
        "name": name,
        "labels": labels,
        # No virtual IP: the gateway dials the task itself, and a /28 holds no address to spare.
        "endpoint_spec": docker.types.EndpointSpec(mode="dnsrr"),
    }


def network_of(spec: SandboxSpec) -> str:
    return spec.session_network.name if spec.session_network is not None else str(spec.network)


class SwarmSandboxes(SwarmSecrets):
    """A service per sandbox: started, listed, watched until ready."""

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        name = spec.name or f"corral-sandbox-{secrets.token_hex(6)}"
        secret = auth.new_secret()
        files = [GivenFile(str(auth.SECRET_FILE), secret.encode() + b"\n", CONTROLLER_UID)]
        files += self._host_files(spec.files or {}, CONTROLLER_UID)
        refs = self._give(name, files)
        try:
            created = self.client.api.create_service(**sandbox_service(spec, name, refs, self.options.constraints))
        except (docker.errors.APIError, SandboxError) as exc:
            self._remove_secrets({OWNER_LABEL: name})
            detail = exc.explanation if isinstance(exc, docker.errors.APIError) else str(exc)
            raise SandboxError(f"swarm driver: cannot start a sandbox: {detail or exc}") from None
        ident = str(created["ID"])
        try:
            host, node = self._await_task(ident, name, network_of(spec))
        except SandboxError:
            self.remove(ident)
            raise
        self._keep_secret(ident, secret)
        return SandboxAddress(ident, name, host, CONTROLLER_PORT, secret, node)

    def _await_task(self, ident: str, name: str, network: str) -> tuple[str, str]:
        """Its task running with an address on ``network``: (address, node). Raises with the task's
        own reason when Swarm cannot place or start it (no such image on a node, no node fits), or
        when its node goes meanwhile."""
        deadline = time.monotonic() + self.options.start_timeout_s
        while True:
            nodes = self._nodes()
            task = newest_task(self._tasks(ident))
            state = task_state(task) if task is not None else ""
            node, gone = self._node_of(task, nodes)
            if task is not None and gone:
                raise SandboxError(f"swarm driver: node {node} left while sandbox {name} was starting")
            if state == "running":
                address = task_address(task or {}, network)
                if address:
                    return address, node
            elif state in ("failed", "rejected", "shutdown", "complete", "orphaned", "remove"):
                raise SandboxError(f"swarm driver: sandbox {name} did not start: {task_error(task)}")
            if time.monotonic() > deadline:
                why = task_error(task) if task is not None else "no node took it"
                raise SandboxError(
                    f"swarm driver: sandbox {name} not running after {self.options.start_timeout_s:.0f} s ({why})"
                )
            time.sleep(_TASK_EVERY_S)

    def sandbox_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        """Service id -> state of every sandbox with ``labels``: one listing of services, one of their
        tasks, one of the nodes."""
        if self.guard is not None:
            self.guard.refresh()  # the reaper's round: a node that joined gets labelled and blocked (30 s at most)
        services = self._services({SANDBOX_LABEL: SANDBOX_ROLE, **labels})
        if not services:
            return {}
        tasks = self.client.api.tasks(filters={"service": [str(s["ID"]) for s in services]})
        by_service: dict[str, list[dict[str, Any]]] = {}
        for task in tasks:
            by_service.setdefault(str(task.get("ServiceID")), []).append(task)
        nodes = self._nodes()
        out: dict[str, State] = {}
        for service in services:
            task = newest_task(by_service.get(str(service["ID"]), []))
            out[str(service["ID"])] = runtime_state(task, self._node_of(task, nodes)[1])
        return out

    def exit_info(self, ident: str) -> ExitInfo | None:
        try:
            self.client.api.inspect_service(ident)
        except docker.errors.NotFound:
            return ExitInfo("gone", None, False)
        task = self._task(ident)
        node, gone = self._node_of(task, self._nodes())
        return exit_of(task, node, gone)

    def list_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        out = []
        nodes = self._nodes()
        for service in self._services({SANDBOX_LABEL: SANDBOX_ROLE, **(labels or {})}):
            ident, name = str(service["ID"]), str((service.get("Spec") or {}).get("Name", ""))
            task = self._task(ident)
            node, gone = self._node_of(task, nodes)
            running = task is not None and task_state(task) == "running" and not gone
            address = None
            secret = self._kept_secret(ident)
            host = _first_address(task) if running and task is not None else ""
            if host and secret:
                address = SandboxAddress(ident, name, host, CONTROLLER_PORT, secret, node)
            labels_of = dict((service.get("Spec") or {}).get("Labels") or {})
            out.append(SandboxInfo(ident, name, labels_of, running, address, node))
        return out

    def remove(self, ident: str) -> None:
        """The service (its task stopped by Swarm), its secrets, the kept secret; nothing when gone."""
        try:
            name = str(self.client.api.inspect_service(ident)["Spec"]["Name"])
        except docker.errors.NotFound:
            name = ""
        self._remove_service(ident)
        if name:
            self._remove_secrets({OWNER_LABEL: name})
        self._forget_secret(ident)

    def logs(self, ident: str, tail: int = 100) -> str:
        return self._service_logs(ident, tail)

    def wait_ready(self, sandbox: SandboxAddress, timeout_s: float = 60.0) -> float:
        """Until the controller's /healthz answers 200 with its proof; the task's state read now and then."""
        start = time.monotonic()
        looked = start
        url = f"{sandbox.base_url}/healthz"
        while True:
            signed = auth.sign(sandbox.secret)
            request = urllib.request.Request(url, headers=signed.headers)
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        if not auth.proven(sandbox.secret, signed.nonce, response.headers):
                            raise SandboxError(f"sandbox {sandbox.name}: whatever answers on its port is no controller")
                        return time.monotonic() - start
            except urllib.error.HTTPError as exc:
                exc.close()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() - looked >= 1.0:
                looked = time.monotonic()
                ended = self.exit_info(sandbox.id)
                if ended is not None:
                    raise SandboxError(
                        f"sandbox {sandbox.name} ended while starting ({ended.state}, exit {ended.exit_code}):\n"
                        f"{self.logs(sandbox.id, 40)}"
                    )
            if time.monotonic() - start > timeout_s:
                raise SandboxError(
                    f"sandbox {sandbox.name} not ready after {timeout_s:.0f}s:\n{self.logs(sandbox.id, 40)}"
                )
            time.sleep(_REFUSED_EVERY_S)


def _first_address(task: Mapping[str, Any]) -> str:
    """A sandbox's address: on its only network (its session's overlay or the shared one)."""
    for attachment in task.get("NetworksAttachments") or []:
        name = ((attachment.get("Network") or {}).get("Spec") or {}).get("Name", "")
        if name != "ingress":
            found = task_address(task, str(name))
            if found:
                return found
    return ""
