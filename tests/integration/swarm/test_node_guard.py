"""The host guard on every node of a real swarm (scripts/swarm): no task Corral starts reaches any
node's own services, whatever the session's allowlist says.

Played as the attacker: a process with the proxy's uid on the proxies' (non-internal) egress overlay,
on each node, dials every node's swarm gossip port (7946), the manager's control port (2377), the
registry (5000) and its own node through the bridge's gateway address; a process with the agent's
uid on a session's internal overlay does the same. A listener on the overlay is the control: it
must stay reachable, so a probe that reaches nothing proves nothing.

Needs a swarm up with the images (`scripts/swarm up --images`, its CORRAL_SWARM_* variables in the
environment) whose desktop image has `corral.runtime.nodeguard`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import docker
import docker.errors
import pytest

from corral.runtime.swarm import guardservice

from . import probes

PROXY_UID = "1001"
AGENT_UID = "1100"
DROPPED = {"timeout", "unreachable"}  # "refused" is an answer: whatever refused was reached


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    client = probes.manager()
    try:
        client.swarm.reload()
    except (docker.errors.DockerException, OSError) as exc:
        pytest.skip(f"no swarm at {probes.swarm_dir()} ({exc}): scripts/swarm up --images with CORRAL_SWARM_*")
    yield client
    client.close()


@pytest.fixture(scope="module")
def image() -> str:
    return os.environ.get("CORRAL_SWARM_IMAGE", f"{probes.swarm_net()}.1:5000/corral-desktop:latest")


@pytest.fixture(scope="module")
def nodes(client: docker.DockerClient) -> list[str]:
    names = probes.node_names(client)
    assert len(names) >= 2, names
    return names


@pytest.fixture(scope="module")
def egress_net(client: docker.DockerClient) -> Iterator[str]:
    with probes.overlay(client, f"crl-b-egress-{probes.suffix()}", internal=False) as name:
        yield name


@pytest.fixture(scope="module")
def session_net(client: docker.DockerClient) -> Iterator[str]:
    with probes.overlay(client, f"crl-b-session-{probes.suffix()}", internal=True) as name:
        yield name


@pytest.fixture(scope="module")
def control(client: docker.DockerClient, image: str, egress_net: str) -> Iterator[str]:
    with probes.listener(client, image, egress_net, 8080) as name:
        yield f"{name}:8080"


def swarm_targets(node: str) -> list[str]:
    """Every node's gossip, the manager's control port and the registry, and the node itself
    through its bridge's address (the INPUT path) when it has that bridge yet."""
    net = probes.swarm_net()
    targets = [f"{net}.{n}:7946" for n in (1, 2, 3)] + [f"{net}.1:2377", f"{net}.1:5000"]
    bridge = probes.bridge_address(node)
    return [*targets, f"{bridge}:7946"] if bridge else targets


def test_without_a_guard_a_proxy_reaches_the_swarm_s_own_ports(
    client: docker.DockerClient, image: str, nodes: list[str], egress_net: str, control: str
) -> None:
    """The threat, shown on this swarm before the guard: the test can see a hole when there is one."""
    try:
        client.services.get(guardservice.SERVICE)
        pytest.skip("this swarm is guarded already; the threat is shown only on an unguarded one")
    except docker.errors.NotFound:
        pass
    worker = nodes[-1]
    seen = probes.probe(client, image, worker, egress_net, [control, *swarm_targets(worker)], user=PROXY_UID)
    net = probes.swarm_net()
    assert seen[control] == "open"
    assert seen[f"{net}.1:2377"] == "open", seen  # a worker's task at the manager's control port
    assert seen[f"{net}.1:5000"] == "open", seen  # and at the registry's push


@pytest.fixture(scope="module")
def guarded(client: docker.DockerClient, image: str, nodes: list[str]) -> guardservice.GuardState:
    deadline = time.monotonic() + 180
    state = guardservice.ensure(client, image, registry=f"{probes.swarm_net()}.1:5000")
    while not state.everywhere:
        assert time.monotonic() < deadline, f"the guard is not on every node: {state}"
        time.sleep(1)
        state = guardservice.ensure(client, image, registry=f"{probes.swarm_net()}.1:5000")
    return state


def test_the_guard_runs_on_every_node_and_labels_it(
    client: docker.DockerClient, nodes: list[str], guarded: guardservice.GuardState
) -> None:
    assert guarded.guarded == frozenset(nodes)
    for node in client.nodes.list():
        assert node.attrs["Spec"]["Labels"].get(guardservice.NODE_LABEL) == "on"


def test_a_proxy_on_any_node_reaches_no_node_s_services(
    client: docker.DockerClient,
    image: str,
    nodes: list[str],
    egress_net: str,
    control: str,
    guarded: guardservice.GuardState,
) -> None:
    for node in nodes:
        before = probes.drops(node)
        targets = swarm_targets(node)
        seen = probes.probe(client, image, node, egress_net, [control, *targets], user=PROXY_UID)
        assert seen[control] == "open", (node, seen)  # the overlay itself still works
        assert {target: seen[target] for target in targets if seen[target] not in DROPPED} == {}, node
        assert probes.drops(node) > before, node  # dropped by the guard's rules, not by chance


def test_an_agent_on_a_session_overlay_reaches_no_node_either(
    client: docker.DockerClient, image: str, nodes: list[str], session_net: str, guarded: guardservice.GuardState
) -> None:
    for node in nodes:
        seen = probes.probe(client, image, node, session_net, swarm_targets(node), user=AGENT_UID)
        assert {target: result for target, result in seen.items() if result not in DROPPED} == {}, node


def test_a_guard_updated_with_new_addresses_keeps_blocking(
    client: docker.DockerClient,
    image: str,
    nodes: list[str],
    egress_net: str,
    control: str,
    guarded: guardservice.GuardState,
) -> None:
    """An update (a node joined, the registry moved) replaces every task: the rules stay in force
    across it, since a stopping guard leaves them and the new one syncs."""
    service = guardservice.ensure_service(client, image, registry="registry.corral.test:5000")
    args = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Args"]
    assert "registry.corral.test" in args[1]
    worker = nodes[-1]
    seen = probes.probe(client, image, worker, egress_net, [control, f"{probes.swarm_net()}.1:2377"], user=PROXY_UID)
    assert seen == {control: "open", f"{probes.swarm_net()}.1:2377": "timeout"}
