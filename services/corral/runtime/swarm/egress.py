"""Each session's egress proxy as a Swarm service of one task: its own uid, no capabilities,
read-only root, on the egress overlay and its session's (alias corral-proxy); started from the
gateway's state directory seeded as Swarm secrets (corral.proxy.seed) into a tmpfs of its own, since
no directory is shared across nodes. Removal takes the service, its secrets and the session's overlay."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types

from corral.errors import NotOnThisRuntime, SandboxError, SeedRefused
from corral.proxy.seed import seed_entries
from corral.proxy.sidecar import PROXY_ALIAS
from corral.runtime.docker.engine import (
    EGRESS_ROLE,
    EGRESS_STATE,
    SANDBOX_LABEL,
    proxy_name,
    session_network_name,
)
from corral.runtime.swarm.engine import newest_task, runtime_state, task_address, task_error, task_state
from corral.runtime.swarm.networks import SwarmNetworks
from corral.runtime.swarm.sandboxes import SwarmSandboxes, one_task
from corral.runtime.swarm.secrets import OWNER_LABEL, GivenFile
from corral.runtime.types import SESSION_LABEL, ProxyAddress, ProxySpec, SandboxInfo, State

log = logging.getLogger(__name__)

SEED_DIR = "/run/corral-seed"  # where a proxy's seed appears (its uid's, 0400), planted at its start
PROXY_STATE = f"{EGRESS_STATE}/state"  # the proxy's state directory, inside its tmpfs (0700, its own)
STATE_TMPFS_MB = 256  # audit log and recorded responses on the proxy's node, charged to its memory
_TASK_EVERY_S = 0.25
# The gateway's state directory of the session, on the proxy's service: a restart seeds the new task
# from the gateway's copy as it is then (corral.gateway.egress.mirror), so the chain goes on from it.
STATE_DIR_LABEL = "corral.state-dir"


def proxy_service(
    spec: ProxySpec, uid: int, refs: list[docker.types.SecretReference], constraints: tuple[str, ...]
) -> dict[str, Any]:
    """``create_service``'s arguments for a proxy (the docker driver's options where Swarm has them)."""
    labels = {SANDBOX_LABEL: EGRESS_ROLE, **(spec.labels or {}), SESSION_LABEL: spec.session_id}
    service_labels = {**labels, STATE_DIR_LABEL: str(spec.state_dir)}
    env = {
        "CORRAL_SESSION_NET": spec.network.subnet,
        "CORRAL_STATE_DIR": PROXY_STATE,
        "CORRAL_SEED_DIR": SEED_DIR,
        **(spec.environment or {}),
    }
    # The tmpfs is 1777 (a Swarm tmpfs takes no uid); the proxy makes its state directory 0700 in it.
    state = docker.types.Mount(EGRESS_STATE, None, type="tmpfs", tmpfs_size=STATE_TMPFS_MB << 20, tmpfs_mode=0o1777)
    tmp = docker.types.Mount("/tmp", None, type="tmpfs", tmpfs_size=64 << 20, tmpfs_mode=0o1777)
    container = docker.types.ContainerSpec(
        spec.image,
        env=env,
        user=f"{uid}:{uid}",
        labels=labels,
        mounts=[state, tmp],
        secrets=refs,
        read_only=True,
        cap_drop=["ALL"],
        stop_grace_period=5_000_000_000,  # SIGTERM and a moment: the proxy writes out what it holds
    )
    networks = [docker.types.NetworkAttachmentConfig(spec.network.name, aliases=[PROXY_ALIAS])]
    if spec.egress_network:
        networks.append(docker.types.NetworkAttachmentConfig(spec.egress_network))
    template = one_task(container, spec.cpus, spec.memory, spec.pids, constraints, networks)
    return {
        "task_template": template,
        "name": proxy_name(spec.session_id),
        "labels": service_labels,
        "endpoint_spec": docker.types.EndpointSpec(mode="dnsrr"),
    }


class SwarmEgress(SwarmSandboxes, SwarmNetworks):
    """A proxy service per session, and the session's overlay with it."""

    proxy_uid = 1001  # the egress image's own user (its files are its; no host directory to own)

    def _seed(self, name: str, state_dir: Path) -> list[docker.types.SecretReference]:
        """The proxy's seed from the gateway's state directory, as secrets of the service ``name``."""
        try:
            entries = seed_entries(state_dir)
        except (SeedRefused, OSError) as exc:
            raise SandboxError(f"swarm driver: cannot seed the egress proxy: {exc}") from None
        return self._give(
            name, [GivenFile(f"{SEED_DIR}/{flat}", data, self.proxy_uid) for flat, data in entries.items()]
        )

    def start_proxy(self, spec: ProxySpec) -> ProxyAddress:
        name = proxy_name(spec.session_id)
        refs = self._seed(name, spec.state_dir)
        try:
            created = self.client.api.create_service(
                **proxy_service(spec, self.proxy_uid, refs, self.options.constraints)
            )
        except docker.errors.APIError as exc:
            self._remove_secrets({OWNER_LABEL: name})
            raise SandboxError(f"swarm driver: cannot start the egress proxy: {exc.explanation or exc}") from None
        try:
            address = self._await_proxy(str(created["ID"]), name, spec.network.name)
        except SandboxError:
            self._remove_service(name)
            self._remove_secrets({OWNER_LABEL: name})
            raise
        return ProxyAddress(str(created["ID"]), name, address)

    def _await_proxy(self, ident: str, name: str, network: str) -> str:
        deadline = time.monotonic() + self.options.start_timeout_s
        while True:
            task = newest_task(self._tasks(ident))
            state = task_state(task) if task is not None else ""
            if state == "running":
                address = task_address(task or {}, network)
                if address:
                    return address
            elif state in ("failed", "rejected", "orphaned"):
                raise SandboxError(f"swarm driver: egress proxy {name} did not start: {task_error(task)}")
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"swarm driver: egress proxy {name} not running after {self.options.start_timeout_s:.0f} s"
                )
            time.sleep(_TASK_EVERY_S)

    def list_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        """As :meth:`SwarmSandboxes.list_sandboxes`, the gateway's container first joined to the session
        overlays again (the gateway's reconcile on start lists them: a recreated container is on none)."""
        self.rejoin_session_networks({k: v for k, v in (labels or {}).items() if k != SANDBOX_LABEL})
        return super().list_sandboxes(labels)

    def proxy_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        services = self._services({SANDBOX_LABEL: EGRESS_ROLE, **labels})
        if not services:
            return {}
        tasks = self.client.api.tasks(filters={"service": [str(s["ID"]) for s in services]})
        nodes = self._nodes()
        states: dict[str, State] = {}
        for service in services:
            session_id = ((service.get("Spec") or {}).get("Labels") or {}).get(SESSION_LABEL)
            mine = [t for t in tasks if t.get("ServiceID") == service["ID"]]
            task = newest_task(mine)
            if session_id:
                states[str(session_id)] = runtime_state(task, self._node_of(task, nodes)[1])
        return states

    def restart_proxy(self, session_id: str) -> ProxyAddress:
        """A new task (Swarm's forced update) seeded afresh from the gateway's state directory as it is
        now (the mirrored audit log among it: the new proxy's chain goes on from the copy's head); the
        old seed's secrets go once it runs. Its address may change."""
        name = proxy_name(session_id)
        try:
            service = self.client.api.inspect_service(name)
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot restart {name}: {exc.explanation or exc}") from None
        spec = service["Spec"]
        template = spec["TaskTemplate"]
        state_dir = (spec.get("Labels") or {}).get(STATE_DIR_LABEL)
        old = [str(ref.get("SecretID", "")) for ref in template["ContainerSpec"].get("Secrets") or []]
        if state_dir:
            template["ContainerSpec"]["Secrets"] = self._seed(name, Path(state_dir))
        template["ForceUpdate"] = int(template.get("ForceUpdate", 0)) + 1
        try:
            self.client.api.update_service(
                name,
                version=service["Version"]["Index"],
                task_template=template,
                name=name,
                labels=spec.get("Labels"),
                endpoint_spec=spec.get("EndpointSpec"),
                mode=spec.get("Mode"),
            )
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot restart {name}: {exc.explanation or exc}") from None
        time.sleep(_TASK_EVERY_S)
        address = self._await_proxy(str(service["ID"]), name, session_network_name(session_id))
        if state_dir:
            for secret_id in old:
                with contextlib.suppress(docker.errors.APIError):
                    self.client.api.remove_secret(secret_id)
        return ProxyAddress(str(service["ID"]), name, address)

    def stop_proxy(self, session_id: str) -> None:
        raise NotOnThisRuntime("a proxy stopped and kept (pause): not on the swarm driver (CORRAL_RUNTIME=swarm)")

    def proxy_logs(self, session_id: str, tail: int = 100) -> str:
        return self._service_logs(proxy_name(session_id), tail)

    def remove_egress(self, session_id: str, *, drain: bool = False) -> None:
        """The proxy's service (Swarm stops its task with SIGTERM and the grace period), its secrets,
        then the session's overlay; whatever of them exists."""
        name = proxy_name(session_id)
        self._remove_service(name)
        self._remove_secrets({OWNER_LABEL: name})
        self._drop_network(session_network_name(session_id))

    def remove_all(self, labels: Mapping[str, str]) -> None:
        """Every service, secret and overlay carrying ``labels`` (tests' and bench's cleanup)."""
        for service in self._services(labels):
            name = str((service.get("Spec") or {}).get("Name", ""))
            self._remove_service(str(service["ID"]))
            self._remove_secrets({OWNER_LABEL: name})
            self._forget_secret(str(service["ID"]))
        for network in self.client.api.networks(filters={"label": [f"{k}={v}" for k, v in labels.items()]}):
            self._drop_network(str(network["Name"]))
