"""Each session's egress proxy: its options (its own uid, no capabilities, read-only root), its
start on the session and egress networks, its states, restart and removal with its network."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from corral.errors import SandboxError
from corral.proxy.sidecar import PROXY_ALIAS
from corral.runtime.docker.engine import (
    EGRESS_ROLE,
    EGRESS_STATE,
    LOG_CONFIG,
    SANDBOX_LABEL,
    address_on,
    container_state,
    hand_over,
    proxy_name,
    session_network_name,
)
from corral.runtime.docker.networks import Networks
from corral.runtime.types import (
    SESSION_LABEL,
    ProxyAddress,
    ProxySpec,
    State,
)

log = logging.getLogger(__name__)


def proxy_options(spec: ProxySpec, name: str, uid: int, endpoint: Any) -> dict[str, Any]:
    """``containers.create``'s options for a proxy: its own ``uid``, no capabilities, read-only root;
    ``endpoint``: its first network's endpoint config (:meth:`Egress._proxy_endpoint`)."""
    session_net = spec.network.name
    return {
        "name": name,
        "labels": {SANDBOX_LABEL: EGRESS_ROLE, **(spec.labels or {}), SESSION_LABEL: spec.session_id},
        "environment": {"CORRAL_SESSION_NET": spec.network.subnet, **(spec.environment or {})},
        "network": spec.egress_network or session_net,
        "networking_config": endpoint,
        "volumes": {str(spec.state_dir): {"bind": EGRESS_STATE, "mode": "rw"}},
        "user": f"{uid}:{uid}",
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


class Egress(Networks):
    """A proxy container per session, and the session's network with it."""

    def _proxy_endpoint(self, spec: ProxySpec) -> Any:
        """Never Docker's default bridge: the first network is named, with the alias if it is the session's."""
        if spec.egress_network:
            return None
        return {spec.network.name: self.client.api.create_endpoint_config(aliases=[PROXY_ALIAS])}

    def start_proxy(self, spec: ProxySpec) -> ProxyAddress:
        """Start a session's proxy on the egress network and its session network (alias corral-proxy);
        without an egress network, on the session network alone. Its state directory becomes its uid's."""
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        if self.host_root + self.proxy_uid != os.geteuid():
            hand_over(spec.state_dir, self.host_root + self.proxy_uid)
        name, session_net = proxy_name(spec.session_id), spec.network.name
        try:
            container: Container = self.client.containers.create(
                spec.image, **proxy_options(spec, name, self.proxy_uid, self._proxy_endpoint(spec))
            )
            if spec.egress_network:
                self.client.networks.get(session_net).connect(container, aliases=[PROXY_ALIAS])
            container.start()
            container.reload()
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {spec.image} not found; build it with `corral images build`") from None
        except docker.errors.APIError as exc:
            self.remove(name)
            raise SandboxError(f"cannot start the egress proxy: {exc.explanation or exc}") from None
        address = address_on(container, session_net)
        if not address:
            container.remove(force=True)
            raise SandboxError(f"egress proxy {name} has no address on {session_net}")
        return ProxyAddress(container.id, container.name, address)

    def proxy_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        """Session id -> state of every proxy with ``labels``, from one listing."""
        wanted = {SANDBOX_LABEL: EGRESS_ROLE, **labels}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        states: dict[str, State] = {}
        for container in self.client.containers.list(all=True, filters=filters, sparse=True):
            session_id = (container.attrs.get("Labels") or {}).get(SESSION_LABEL)
            if session_id:
                states[str(session_id)] = container_state(str(container.status))
        return states

    def restart_proxy(self, session_id: str) -> ProxyAddress:
        name = proxy_name(session_id)
        try:
            container = self._container(name)
            container.restart(timeout=2)
            container.reload()
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot restart {name}: {exc.explanation or exc}") from None
        return ProxyAddress(container.id, container.name, address_on(container, session_network_name(session_id)))

    def stop_proxy(self, session_id: str) -> None:
        name = proxy_name(session_id)
        try:
            # SIGTERM and a moment: mitmdump's shutdown writes out the responses still queued for the file.
            self._container(name).stop(timeout=5)
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot stop {name}: {exc.explanation or exc}") from None

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
        for container in self.client.containers.list(all=True, filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        for network in self.client.networks.list(filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                self.remove_network(network.name)
