"""Networks: the shared sandbox and egress bridges, each session's ``--internal`` network from a
pool of small subnets, and the host guard on every bridge."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

import docker
import docker.errors
import docker.types

from corral.errors import SandboxError
from corral.runtime import hostguard
from corral.runtime.docker.engine import (
    NETWORK_ROLE,
    SANDBOX_LABEL,
    Engine,
    bridge_interface,
    session_network_name,
)
from corral.runtime.types import (
    SESSION_LABEL,
    SessionNetwork,
)

log = logging.getLogger(__name__)


def session_network_of(attrs: Mapping[str, Any]) -> SessionNetwork:
    """A session network from Docker's inspect of it: its name, subnet and gateway."""
    config = ((attrs.get("IPAM") or {}).get("Config") or [{}])[0]
    return SessionNetwork(str(attrs["Name"]), str(config.get("Subnet", "")), str(config.get("Gateway", "")))


def subnets_in_use(networks: Iterable[Mapping[str, Any]]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every subnet of the networks (Docker's inspect of each) that a new session network must not
    overlap; entries that are no subnet are skipped (the swarm driver's overlays too)."""
    used = []
    for attrs in networks:
        for config in (attrs.get("IPAM") or {}).get("Config") or []:
            with contextlib.suppress(ValueError, TypeError):
                used.append(ipaddress.ip_network(config.get("Subnet", ""), strict=False))
    return used


def pool_ipam(subnet: ipaddress.IPv4Network | ipaddress.IPv6Network) -> docker.types.IPAMConfig:
    """A session network's IPAM: the subnet, its first address as the network's gateway."""
    return docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet), gateway=str(subnet[1]))])


class Networks(Engine):
    """The bridges sandboxes and proxies sit on, each with the host guard."""

    def _network_exists(self, name: str) -> bool:
        # Docker's name filter matches substrings ("corral-egress" finds "corral-egress-test-1").
        return any(network.name == name for network in self.client.networks.list(names=[name]))

    def _guard(self, name: str) -> bool:
        """The host guard on a network's bridge (idempotent); False when the host does not allow it."""
        return hostguard.install(bridge_interface(self.client.networks.get(name).attrs))

    def ensure_sandbox_network(self, name: str) -> bool:
        """A bridge network whose containers cannot talk to each other (inter-container traffic off),
        guarded: nothing on it reaches the host's own services."""
        if not self._network_exists(name):
            try:
                self.client.networks.create(
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
                self.client.networks.create(name, driver="bridge", labels={SANDBOX_LABEL: NETWORK_ROLE})
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
            network = self.client.networks.get(name)
        except docker.errors.NotFound:
            hostguard.remove_stale()
            return
        for container_id in network.attrs.get("Containers") or {}:
            with contextlib.suppress(docker.errors.APIError):
                network.disconnect(container_id, force=True)
        with contextlib.suppress(docker.errors.NotFound):
            network.remove()
        hostguard.remove(bridge_interface(network.attrs))

    def _used_subnets(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return subnets_in_use(network.attrs for network in self.client.networks.list())

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
            ipam = pool_ipam(candidate)
            try:
                network = self.client.networks.create(
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
            if not hostguard.install(bridge_interface(network.attrs)):
                log.error("no host guard on %s: the sandbox's own firewall is the only barrier", name)
            return session_network_of(network.attrs)
        raise SandboxError(f"no free /{prefix} left in the session network pool {subnets} (CORRAL_SESSION_SUBNETS)")

    def session_networks(self, labels: Mapping[str, str]) -> list[SessionNetwork]:
        """Every session network carrying ``labels`` (for the gateway's reconcile on start)."""
        wanted = {SANDBOX_LABEL: NETWORK_ROLE, **labels}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        out = []
        for network in self.client.networks.list(filters=filters):
            with contextlib.suppress(KeyError, IndexError, TypeError):
                out.append(session_network_of(network.attrs))
        return out

    def remove_session_network(self, network: SessionNetwork) -> None:
        self.remove_network(network.name)
