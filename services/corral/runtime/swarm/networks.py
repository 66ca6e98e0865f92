"""Overlay networks: the shared ones (sandboxes without egress control, the proxies' way out) and each
session's internal one from the pool of small subnets, the gateway's container joined to it at a
fixed address (the one the sandbox's firewall lets in), and left when it goes."""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import random
import re
import time
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
import docker.types

from corral.errors import SandboxError
from corral.runtime.docker.engine import NETWORK_ROLE, SANDBOX_LABEL, session_network_name
from corral.runtime.docker.networks import pool_ipam, subnets_in_use
from corral.runtime.swarm.engine import SwarmEngine, label_filters
from corral.runtime.types import SESSION_LABEL, SessionNetwork

log = logging.getLogger(__name__)

OVERLAY = "overlay"
# A 500 naming a network the engine does not find: to a removal, the network went after its name
# was looked up; to a join, the overlay was just made and a node just rejoined (asked again).
NETWORK_GONE = re.compile(r"network \S+ not found")
# How long a join is asked again while the manager times out allocating the gateway's attachment
# (about 20 s an attempt) or the engine does not know the new overlay yet. Seen: three attempts in
# 42 s all refused right after a cut worker rejoined, the manager still busy with it.
JOIN_PATIENCE_S = 120.0
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def gateway_address(subnet: str) -> str:
    """Where the gateway's container sits on a session's overlay: its last host address (Swarm hands
    tasks the lowest free ones; .1 is the overlay's own bridge). The sandbox's firewall lets the
    controller's port be reached from it alone."""
    hosts = list(ipaddress.ip_network(subnet).hosts())
    return str(hosts[-1])


def session_network_of(attrs: Mapping[str, Any]) -> SessionNetwork:
    config = ((attrs.get("IPAM") or {}).get("Config") or [{}])[0]
    subnet = str(config.get("Subnet", ""))
    return SessionNetwork(str(attrs["Name"]), subnet, gateway_address(subnet) if subnet else "")


def rotated(candidates: list[IPNetwork], last: IPNetwork | None) -> list[IPNetwork]:
    """The pool's subnets from the one after ``last`` round to it: a subnet just freed is the last to
    be taken again. A node drops a removed overlay's namespace lazily, and a task placed there on a new
    overlay of the same subnet is rejected ("Pool overlaps with other one on this address space")."""
    if last is None or last not in candidates:
        return candidates
    after = candidates.index(last) + 1
    return candidates[after:] + candidates[:after]


class SwarmNetworks(SwarmEngine):
    """Overlays, and the gateway's container on each session's."""

    _subnet_cursor: IPNetwork | None = None  # the last subnet this runtime took

    def _overlay_options(self) -> dict[str, str] | None:
        """The overlay driver's options: ``encrypted`` (``docker network create --opt encrypted``) when
        the operator asked for it (SwarmOptions.encrypted_overlays)."""
        return {"encrypted": ""} if self.options.encrypted_overlays else None

    def _overlay_exists(self, name: str) -> bool:
        return any(network.get("Name") == name for network in self.client.api.networks(names=[name]))

    def _ensure_overlay(self, name: str, internal: bool) -> None:
        if self._overlay_exists(name):
            return
        try:
            self.client.api.create_network(
                name,
                driver=OVERLAY,
                attachable=True,
                internal=internal,
                labels={SANDBOX_LABEL: NETWORK_ROLE},
                options=self._overlay_options(),
            )
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise SandboxError(f"swarm driver: cannot create overlay {name}: {exc.explanation or exc}") from None

    def ensure_sandbox_network(self, name: str) -> bool:
        """An attachable overlay for sandboxes without egress control, the gateway's container on it;
        whether the host guard (a global service, docs/swarm.md) runs on every node."""
        self._ensure_overlay(name, internal=False)
        self._join(name, None)
        return self.guard_everywhere()

    def ensure_egress_network(self, name: str) -> bool:
        """The attachable overlay proxies reach upstreams through (Swarm's gateway bridge NATs it out);
        whether the host guard runs on every node (it closes that bridge's way to the nodes)."""
        self._ensure_overlay(name, internal=False)
        return self.guard_everywhere()

    def remove_stale_guards(self) -> list[str]:
        return []  # no rules of the gateway's own on a swarm: the host guard is a global service

    def _join(self, network: str, address: str | None) -> None:
        """The gateway's container on ``network`` (at ``address``); nothing when it is there already.

        A plain container's join of an overlay waits for the manager to allocate its attachment; a
        busy manager answers "context deadline exceeded" having allocated nothing, and the join is
        asked again (for up to JOIN_PATIENCE_S), as the engine's own `docker run --network` would be
        rerun."""
        give_up_at = self._now() + JOIN_PATIENCE_S
        for attempt in itertools.count(1):
            try:
                self.client.api.connect_container_to_network(self.gateway_container, network, ipv4_address=address)
                return
            except docker.errors.APIError as exc:
                text = str(exc.explanation or exc)
                if "already exists" in text or "already attached" in text:
                    return
                patient = self._now() < give_up_at
                if "context deadline exceeded" in text and patient:
                    log.warning("joining %s timed out at the manager (attempt %d): again", network, attempt)
                    continue
                if NETWORK_GONE.fullmatch(text.strip()) and patient:
                    # Just made at the manager, yet not found by the engine: seen right after a node
                    # rejoined, the attempt after a timed-out one (the manager still reconciling).
                    log.warning("joining %s: not found by the engine yet (attempt %d): again", network, attempt)
                    self._pause(1.0)
                    continue
                raise SandboxError(
                    f"swarm driver: cannot join the gateway's container {self.gateway_container} to {network}: {text}"
                ) from None

    def _leave(self, network: str) -> None:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.client.api.disconnect_container_from_network(self.gateway_container, network, force=True)

    def _used_subnets(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return subnets_in_use(self.client.api.networks())

    def create_session_network(
        self, session_id: str, labels: Mapping[str, str], subnets: str = "10.213.0.0/16", prefix: int = 28
    ) -> SessionNetwork:
        """An internal attachable overlay (no route out) for one sandbox and its proxy, a /28 of
        ``subnets``, with the gateway's container joined at :func:`gateway_address`."""
        name = session_network_name(session_id)
        used = self._used_subnets()
        candidates: list[IPNetwork] = list(ipaddress.ip_network(subnets).subnets(new_prefix=prefix))
        if self._subnet_cursor is None:
            # A gateway that starts (or restarts) knows nothing of the subnets just freed: it starts at a
            # random place in the pool rather than its head, where the last run's freed ones lie.
            self._subnet_cursor = random.choice(candidates)
        for candidate in rotated(candidates, self._subnet_cursor):
            if any(candidate.overlaps(other) for other in used):
                continue
            ipam = pool_ipam(candidate)
            try:
                created = self.client.api.create_network(
                    name,
                    driver=OVERLAY,
                    internal=True,
                    attachable=True,
                    ipam=ipam,
                    labels={SANDBOX_LABEL: NETWORK_ROLE, **labels, SESSION_LABEL: session_id},
                    options=self._overlay_options(),
                )
            except docker.errors.APIError as exc:
                if "overlap" in str(exc.explanation or exc).lower():
                    used.append(candidate)
                    continue
                raise SandboxError(f"swarm driver: cannot create overlay {name}: {exc.explanation or exc}") from None
            self._subnet_cursor = candidate
            network = SessionNetwork(name, str(candidate), gateway_address(str(candidate)))
            try:
                self._join(str(created["Id"]), network.gateway)
            except SandboxError:
                self._drop_network(str(created["Id"]))
                raise
            return network
        raise SandboxError(f"no free /{prefix} left in the session network pool {subnets} (CORRAL_SESSION_SUBNETS)")

    def session_networks(self, labels: Mapping[str, str]) -> list[SessionNetwork]:
        wanted = {SANDBOX_LABEL: NETWORK_ROLE, **labels}
        out = []
        for attrs in self.client.api.networks(filters=label_filters(wanted)):
            with contextlib.suppress(KeyError, IndexError, TypeError, ValueError):
                if attrs.get("Driver") == OVERLAY:
                    out.append(session_network_of(attrs))
        return out

    def rejoin_session_networks(self, labels: Mapping[str, str]) -> None:
        """The gateway's container on every session overlay carrying ``labels``, at its address there:
        a gateway container made anew (a new image: ``docker compose up -d``) is on none of them, and
        cannot reach the controllers and proxies it finds until it is. Nothing for one joined already."""
        for network in self.session_networks(labels):
            try:
                self._join(network.name, network.gateway)
            except SandboxError as exc:
                log.warning("%s", exc)  # its sessions are found unreachable and closed as lost

    def remove_session_network(self, network: SessionNetwork) -> None:
        self._drop_network(network.name)

    def _drop_network(self, name: str) -> None:
        """The gateway's container off it, then the overlay; nothing when it is gone already. A task
        still shutting down holds its endpoint a moment: the removal is tried until it lets go."""
        self._leave(name)
        for _ in range(50):
            try:
                self.client.api.remove_network(name)
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                text = str(exc.explanation or exc)
                if NETWORK_GONE.fullmatch(text.strip()):
                    # Gone between the name's lookup and its removal (another removal of the same
                    # session's pair just took it): the manager answers 500, not 404.
                    return
                # A task still shutting down holds it: "has active endpoints", "is in use by task".
                if "active endpoints" not in text and "in use by task" not in text:
                    raise SandboxError(f"swarm driver: cannot remove {name}: {exc.explanation or exc}") from None
            self._pause(0.2)
        raise SandboxError(f"swarm driver: {name} still in use after 10 s")

    def _pause(self, seconds: float) -> None:
        time.sleep(seconds)  # a wait on the swarm, never a unit test's: they replace this method

    def _now(self) -> float:
        return time.monotonic()  # a unit test's fake manager replaces this clock with its own
