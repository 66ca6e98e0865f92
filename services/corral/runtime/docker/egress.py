"""Each session's egress proxy: its options (its own uid, no capabilities, read-only root), its
start on the session and egress networks, its states, restart and removal with its network."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from corral.errors import SandboxError, SeedRefused
from corral.proxy import seed
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

SEED_MOUNT = "/run/corral-seed"  # where an unshared proxy finds its seed (a Swarm secret's place, here a bind mount)
UNSHARED_STATE_MIB = 512  # an unshared proxy's tmpfs state: the audit log and the responses, within their budgets


def unshared_options(options: dict[str, Any], seed_dir: Path, uid: int) -> dict[str, Any]:
    """``options`` of a proxy that shares no directory with the gateway: its state on a tmpfs of its
    own (its uid's, 0700), planted at start from the seed mounted read-only (CORRAL_SEED_DIR)."""
    tmpfs = {
        **options["tmpfs"],
        EGRESS_STATE: f"rw,nosuid,nodev,size={UNSHARED_STATE_MIB}m,mode=0700,uid={uid},gid={uid}",
    }
    environment = {**options["environment"], seed.SEED_DIR_VARIABLE: SEED_MOUNT}
    volumes = {str(seed_dir): {"bind": SEED_MOUNT, "mode": "ro"}}
    return {**options, "tmpfs": tmpfs, "environment": environment, "volumes": volumes}


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
        without an egress network, on the session network alone. Its state directory becomes its uid's
        (not shared: its seed, made from the directory, does)."""
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        options = proxy_options(spec, name := proxy_name(spec.session_id), self.proxy_uid, self._proxy_endpoint(spec))
        if self.shares_proxy_state:
            self._hand_to_proxy(spec.state_dir)
        else:
            options = unshared_options(options, self._seed(spec.session_id, spec.state_dir), self.proxy_uid)
        session_net = spec.network.name
        try:
            container: Container = self.client.containers.create(spec.image, **options)
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

    def _hand_to_proxy(self, path: Path) -> None:
        if self.host_root + self.proxy_uid != os.geteuid():
            hand_over(path, self.host_root + self.proxy_uid)

    def _seed(self, session_id: str, state_dir: Path) -> Path:
        """The proxy's seed, made now from the gateway's ``state_dir`` (beside it, 0700, the proxy's)."""
        seed_dir = state_dir.with_name(state_dir.name + ".seed")
        shutil.rmtree(seed_dir, ignore_errors=True)
        try:
            seed.write_state(seed_dir, seed.seed_entries(state_dir))
        except SeedRefused as exc:
            raise SandboxError(f"cannot seed the egress proxy of {session_id}: {exc}") from None
        self._hand_to_proxy(seed_dir)
        self._seeds[session_id] = seed_dir
        return seed_dir

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
        seeded = self._seeds.get(session_id)
        if seeded is not None:
            # Its tmpfs starts empty again: seeded afresh from the gateway's state (the mirror's copy).
            self._seed(session_id, seeded.with_name(seeded.name.removesuffix(".seed")))
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
            # SIGTERM and a moment: the proxy's shutdown writes out the responses still queued for the file.
            self._container(name).stop(timeout=5)
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot stop {name}: {exc.explanation or exc}") from None

    def proxy_logs(self, session_id: str, tail: int = 100) -> str:
        return self.logs(proxy_name(session_id), tail)

    def remove_egress(self, session_id: str, *, drain: bool = False) -> None:
        name = proxy_name(session_id)
        if drain:
            # SIGTERM first: the proxy's shutdown writes out the responses still queued for the file.
            with contextlib.suppress(SandboxError, docker.errors.APIError):
                self._container(name).stop(timeout=1)
        self.remove(name)
        self.remove_network(session_network_name(session_id))
        seeded = self._seeds.pop(session_id, None)
        if seeded is not None:
            shutil.rmtree(seeded, ignore_errors=True)

    def remove_all(self, labels: Mapping[str, str]) -> None:
        """Every container, then every network, carrying ``labels``."""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        for container in self.client.containers.list(all=True, filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        for network in self.client.networks.list(filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                self.remove_network(network.name)
