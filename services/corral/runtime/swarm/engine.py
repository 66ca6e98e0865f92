"""The swarm driver's ground: its options, names, the pure readings of Swarm's task and node records
(states, addresses, how a task ended), and :class:`SwarmEngine`, the client of one manager and the
look-ups every part of :class:`~corral.runtime.swarm.SwarmRuntime` shares."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import docker
import docker.errors
import requests.exceptions

from corral.errors import SandboxError
from corral.runtime.swarm import guardservice
from corral.runtime.types import NODE_LOST, ExitInfo, State, SwarmOptions

log = logging.getLogger(__name__)

DRIVER = "swarm"
# Task states (moby's api/types/swarm TaskState) as the runtime's: not yet running, running, ended.
_STARTING = frozenset({"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting"})
_ENDED_CLEAN = frozenset({"complete", "shutdown"})
_FAILED = frozenset({"failed", "rejected", "remove"})
# A node in one of these is not there: its tasks are lost (their processes may run on, unreachable).
NODE_GONE = frozenset({"down", "unknown", "disconnected"})


def task_state(task: Mapping[str, Any]) -> str:
    return str((task.get("Status") or {}).get("State") or "")


def runtime_state(task: Mapping[str, Any] | None, node_down: bool) -> State:
    """A service's one task as the runtime's State: a task on a node that is gone counts as dead
    (its session ends: :func:`exit_of` says ``node_lost``)."""
    if task is None:
        return "dead"
    state = task_state(task)
    if state == "orphaned" or (node_down and state not in _ENDED_CLEAN | _FAILED):
        return "dead"
    if state in _STARTING:
        return "created"
    if state == "running":
        return "running"
    if state in _ENDED_CLEAN:
        return "exited"
    return "dead"


def exit_of(task: Mapping[str, Any] | None, node: str, node_down: bool) -> ExitInfo | None:
    """None while the task lives (or is on its way to); else how it ended."""
    if task is None:
        return ExitInfo("gone", None, False, node)
    state = task_state(task)
    if state == "orphaned" or (node_down and state not in _ENDED_CLEAN | _FAILED):
        return ExitInfo(NODE_LOST, None, False, node)
    if state in _STARTING or state == "running":
        return None
    code = ((task.get("Status") or {}).get("ContainerStatus") or {}).get("ExitCode")
    exit_code = int(code) if isinstance(code, int) else None
    # Swarm keeps no OOM flag; the kernel's kill shows as 137 with Docker's "OOMKilled" in the error.
    err = str((task.get("Status") or {}).get("Err") or "")
    return ExitInfo("exited" if state in _ENDED_CLEAN else "dead", exit_code, "oom" in err.lower(), node)


def newest_task(tasks: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """A one-task service's task (the newest, should Swarm have made another)."""
    if not tasks:
        return None
    return max(tasks, key=lambda t: str(t.get("CreatedAt") or ""))


def task_address(task: Mapping[str, Any], network_name: str) -> str:
    """The task's address on ``network_name`` ("" when it has none there yet)."""
    for attachment in task.get("NetworksAttachments") or []:
        spec = (attachment.get("Network") or {}).get("Spec") or {}
        if spec.get("Name") == network_name:
            for cidr in attachment.get("Addresses") or []:
                with contextlib.suppress(ValueError):
                    return str(ipaddress.ip_interface(cidr).ip)
    return ""


def task_error(task: Mapping[str, Any] | None) -> str:
    if task is None:
        return "no task"
    status = task.get("Status") or {}
    return f"{status.get('State')}: {status.get('Err') or status.get('Message') or '(no reason given)'}"


def label_filters(labels: Mapping[str, str]) -> dict[str, list[str]]:
    return {"label": [f"{k}={v}" for k, v in labels.items()]}


class SwarmEngine:
    """The client of one swarm manager (``DOCKER_HOST``) and the task and node look-ups every part shares."""

    shares_proxy_state = False  # a proxy's state is its own (a tmpfs on its node), seeded and mirrored

    def __init__(self, client: docker.DockerClient | None = None, options: SwarmOptions | None = None) -> None:
        options = options or SwarmOptions()
        if options.guard_image:
            # Only nodes whose host guard is in force take a sandbox or a proxy (docs/design/0430).
            options = dataclasses.replace(options, constraints=(*options.constraints, guardservice.PLACEMENT))
        self.options = options
        try:
            self.client = client or docker.from_env()
            info = self.client.info()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxError(f"swarm driver: cannot reach the swarm manager (DOCKER_HOST): {exc}") from None
        swarm = info.get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
            raise SandboxError(
                f"swarm driver: the engine at DOCKER_HOST is no swarm manager (swarm state "
                f"{swarm.get('LocalNodeState')!r}, manager: {bool(swarm.get('ControlAvailable'))})"
            )
        self.guard = guardservice.GuardKeeper(self.client, options.guard_image) if options.guard_image else None

    def guard_everywhere(self) -> bool:
        """The host guard made as it should be now, and whether it runs on every ready node."""
        if self.guard is None:
            return False
        try:
            return self.guard.settle().everywhere
        except docker.errors.DockerException as exc:
            log.error("swarm driver: cannot start the host guard (%s): no session is placed until it runs", exc)
            return False

    @property
    def gateway_container(self) -> str:
        return self.options.gateway_container or socket.gethostname()

    def _tasks(self, service: str) -> list[dict[str, Any]]:
        try:
            tasks: list[dict[str, Any]] = self.client.api.tasks(filters={"service": service})
        except docker.errors.NotFound:
            return []
        except docker.errors.APIError as exc:
            raise SandboxError(f"swarm driver: cannot list the tasks of {service}: {exc.explanation or exc}") from None
        return tasks

    def _task(self, service: str) -> Mapping[str, Any] | None:
        return newest_task(self._tasks(service))

    def _nodes(self) -> dict[str, tuple[str, bool]]:
        """Node id -> (host name, gone)."""
        try:
            nodes = self.client.api.nodes()
        except docker.errors.APIError as exc:
            raise SandboxError(f"swarm driver: cannot list the nodes: {exc.explanation or exc}") from None
        out = {}
        for node in nodes:
            hostname = str((node.get("Description") or {}).get("Hostname") or node.get("ID", ""))
            state = str((node.get("Status") or {}).get("State") or "unknown")
            out[str(node.get("ID"))] = (hostname, state in NODE_GONE)
        return out

    def _node_of(self, task: Mapping[str, Any] | None, nodes: Mapping[str, tuple[str, bool]]) -> tuple[str, bool]:
        """The task's node's host name, and whether it is gone (a node Swarm removed counts as gone)."""
        if task is None or not task.get("NodeID"):
            return "", False
        return nodes.get(str(task["NodeID"]), (str(task["NodeID"]), True))

    def _services(self, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        try:
            services: list[dict[str, Any]] = self.client.api.services(filters=label_filters(labels))
        except docker.errors.APIError as exc:
            raise SandboxError(f"swarm driver: cannot list services: {exc.explanation or exc}") from None
        return services

    def _remove_service(self, ident: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.client.api.remove_service(ident)

    def _remove_secrets(self, labels: Mapping[str, str]) -> None:
        """Every secret carrying ``labels``; one still held by a service going away is retried briefly."""
        for secret in self.client.api.secrets(filters=label_filters(labels)):
            with contextlib.suppress(docker.errors.NotFound):
                try:
                    self.client.api.remove_secret(secret["ID"])
                except docker.errors.APIError as exc:
                    log.warning("secret %s stays for now: %s", secret.get("Spec", {}).get("Name"), exc)

    def _service_logs(self, ident: str, tail: int) -> str:
        try:
            chunks = self.client.api.service_logs(ident, stdout=True, stderr=True, tail=tail, follow=False)
            raw = b"".join(chunks) if not isinstance(chunks, bytes) else chunks
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            return f"(no logs: {exc})"
        return raw.decode(errors="replace")[-20000:]
