"""The host guard on every Swarm node: the global service `corral-hostguard` and the node label
that says a node's guard is in force.

Each task runs `corral.runtime.nodeguard` in its node's own network namespace (the `host` network),
as root with NET_ADMIN and NET_RAW, from the desktop image (it has Python, Corral and iptables).
The runtime gives it what only a manager knows: every node's and manager's address and the
registry's host; each task adds its node's own addresses. Swarm starts a task on a node that joins
later by itself; the runtime updates the list when the swarm's addresses change.

A node counts as guarded once its task is `running`: the task's health check passes only after a
complete pass of rules, and Swarm holds a task in `starting` until then. The runtime labels guarded
nodes `corral.hostguard=on` and places sandboxes and proxies with `PLACEMENT`, so no session lands
on a node before (or after) its guard.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
from docker.models.nodes import Node
from docker.models.services import Service
from docker.types import Healthcheck, RestartPolicy, ServiceMode

log = logging.getLogger(__name__)

SERVICE = "corral-hostguard"
NODE_LABEL = "corral.hostguard"
PLACEMENT = f"node.labels.{NODE_LABEL}==on"
READY_FILE = "/tmp/corral-nodeguard.ok"
ROLE_LABEL = "corral.role"
_SECOND_NS = 1_000_000_000
# How often a runtime looks again (a node joined or left: the list every guard drops changes).
REFRESH_S = 30.0
# How long a starting gateway waits for the guard on every node (made or updated: each task's first
# pass and health check, one node after another), before it reports the guard as not everywhere.
SETTLE_S = 60.0


@dataclass(frozen=True)
class GuardState:
    """Where the guard is in force: node host names with a running guard task, and those without."""

    guarded: frozenset[str]
    unguarded: frozenset[str]

    @property
    def everywhere(self) -> bool:
        return bool(self.guarded) and not self.unguarded


def _host(address: str) -> str:
    """The host of ``address`` ("10.0.0.1:2377", "[fd00::1]:2377", "10.0.0.1"): what is dropped."""
    address = address.strip()
    if address.startswith("["):
        return address[1 : address.index("]")]
    if address.count(":") == 1:
        return address.rsplit(":", 1)[0]
    return address


def registry_host(image: str) -> str | None:
    """The registry host of an image reference, None for Docker Hub's short names ("corral-desktop:x")."""
    first, slash, _ = image.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        return None
    return _host(first)


def node_addresses(nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every address the swarm's nodes are known by (status and manager addresses), from the
    manager's node list; unspecified ones ("0.0.0.0") dropped."""
    found: dict[str, None] = {}
    for node in nodes:
        for raw in (node.get("Status", {}).get("Addr", ""), node.get("ManagerStatus", {}).get("Addr", "")):
            host = _host(raw) if raw else ""
            if not host:
                continue
            try:
                if ipaddress.ip_address(host).is_unspecified:
                    continue
            except ValueError:
                pass
            found[host] = None
    return list(found)


def guard_args(blocked: Iterable[str]) -> list[str]:
    return ["--block", ",".join(sorted(set(blocked))), "--ready-file", READY_FILE]


def _create(client: docker.DockerClient, image: str, args: list[str], labels: Mapping[str, str]) -> None:
    client.services.create(
        image,
        command=["python", "-P", "-m", "corral.runtime.nodeguard"],
        args=args,
        name=SERVICE,
        labels={ROLE_LABEL: "hostguard", **labels},
        container_labels={ROLE_LABEL: "hostguard", **labels},
        mode=ServiceMode("global"),
        networks=["host"],
        user="root",
        cap_add=["CAP_NET_ADMIN", "CAP_NET_RAW"],
        # A guard that dies comes back; Swarm restarts it (condition any), unlike a session's task.
        restart_policy=RestartPolicy(condition="any", delay=_SECOND_NS),
        healthcheck=Healthcheck(
            test=["CMD", "test", "-e", READY_FILE],
            interval=_SECOND_NS,
            timeout=_SECOND_NS,
            retries=30,
            start_period=0,
        ),
    )


def ensure_service(
    client: docker.DockerClient, image: str, registry: str | None, labels: Mapping[str, str] | None = None
) -> Service:
    """Create the guard service, or update it when its image or its blocked list changed (a node
    joined or left); returns it. Shared by every gateway on the swarm: one per swarm."""
    blocked = node_addresses(node.attrs for node in client.nodes.list())
    host = registry_host(image)
    blocked += [item for item in (host, registry and _host(registry.partition("/")[0])) if item]
    args = guard_args(blocked)
    try:
        service: Service = client.services.get(SERVICE)
    except docker.errors.NotFound:
        log.info("starting the host guard on every node (%s)", args[1])
        _create(client, image, args, labels or {})
        return client.services.get(SERVICE)
    spec = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]
    if spec.get("Args") != args or spec.get("Image", "").split("@")[0] != image:
        log.info("updating the host guard (%s)", args[1])
        service.update(image=image, args=args)
        service.reload()
    return service


def _running_nodes(service: Service) -> set[str]:
    return {
        task["NodeID"]
        for task in service.tasks(filters={"desired-state": "running"})
        if task.get("Status", {}).get("State") == "running" and task.get("NodeID")
    }


def _set_label(node: Node, on: bool) -> None:
    spec = dict(node.attrs["Spec"])
    labels = dict(spec.get("Labels") or {})
    if (labels.get(NODE_LABEL) == "on") == on:
        return
    if on:
        labels[NODE_LABEL] = "on"
    else:
        labels.pop(NODE_LABEL, None)
    spec["Labels"] = labels
    node.update(spec)


def mark_nodes(client: docker.DockerClient, service: Service | None) -> GuardState:
    """Label each ready node by whether its guard task runs (a node without one, or not ready, takes
    no session) and say where the guard is in force; without the service (removed by hand) no node
    is guarded."""
    running = _running_nodes(service) if service is not None else set()
    guarded: set[str] = set()
    unguarded: set[str] = set()
    for node in client.nodes.list():
        if node.attrs.get("Status", {}).get("State") != "ready":
            # A node that is not there may come back without the guard's rules (a reboot): it takes
            # no session until its guard runs again and labels it anew (a manager that refuses the
            # update now is asked again next round: the others are labelled meanwhile).
            try:
                _set_label(node, False)
            except docker.errors.APIError as exc:
                log.warning("cannot take the guard's label off node %s: %s", node.id, exc)
            continue
        name = node.attrs.get("Description", {}).get("Hostname", node.id)
        on = node.id in running
        _set_label(node, on)
        (guarded if on else unguarded).add(name)
    return GuardState(frozenset(guarded), frozenset(unguarded))


def relabel(client: docker.DockerClient) -> GuardState:
    """The nodes labelled by the guard tasks running now (none when the service was removed by hand)."""
    try:
        service: Service | None = client.services.get(SERVICE)
    except docker.errors.NotFound:
        service = None
    return mark_nodes(client, service)


def ensure(
    client: docker.DockerClient, image: str, registry: str | None = None, labels: Mapping[str, str] | None = None
) -> GuardState:
    """The whole step a swarm runtime takes at start and on each reconcile: the service as it
    should be, the nodes labelled, where it holds."""
    return mark_nodes(client, ensure_service(client, image, registry, labels))


class GuardKeeper:
    """What a swarm runtime holds: ``ensure`` at start, ``refresh`` from any frequent round (it acts at
    most every ``every_s``), so a node that joins is labelled and blocked by every other node's guard
    within that time. A node not yet labelled takes no session meanwhile: late, never unguarded."""

    def __init__(
        self,
        client: docker.DockerClient,
        image: str,
        registry: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        every_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client, self.image, self.registry, self.labels = client, image, registry, dict(labels or {})
        self.every_s, self.clock, self.sleep = every_s, clock, sleep
        self.state = GuardState(frozenset(), frozenset())
        self._last: float | None = None

    def ensure(self) -> GuardState:
        self._last = self.clock()
        self.state = ensure(self.client, self.image, self.registry, self.labels)
        return self.state

    def settle(self, limit_s: float | None = None) -> GuardState:
        """``ensure``, then again each second until the guard runs on every ready node or
        ``limit_s`` passed (a fresh or updated guard takes a few seconds per node)."""
        deadline = self.clock() + (SETTLE_S if limit_s is None else limit_s)
        self.ensure()
        while not self.state.everywhere and self.clock() < deadline:
            self.sleep(1.0)
            self.ensure()
        if not self.state.everywhere:
            log.warning(
                "the host guard is not running on %s yet: no session is placed there until it is",
                ", ".join(sorted(self.state.unguarded)) or "any node",
            )
        return self.state

    def refresh(self) -> GuardState | None:
        """``ensure`` when it is due; None when it is not. A manager that does not answer is logged,
        not raised: the labels stay as they were, which places nothing on an unguarded node."""
        if self._last is not None and self.clock() - self._last < self.every_s:
            return None
        try:
            return self.ensure()
        except docker.errors.DockerException as exc:
            log.error("cannot refresh the host guard: %s", exc)
            return None
