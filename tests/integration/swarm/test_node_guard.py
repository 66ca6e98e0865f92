"""The host guard on every node of a real swarm (scripts/swarm): no task Corral starts reaches any
node's own services, whatever the session's allowlist says.

Played as the attacker: a process with the proxy's uid on the proxies' (non-internal) egress overlay,
on each node, dials every node's swarm gossip port (7946), the manager's control port (2377), the
registry (5000) and its own node through the bridge's gateway address; a process with the agent's
uid on a session's internal overlay does the same. A listener on the overlay is the control: it
must stay reachable, so a probe that reaches nothing proves nothing.

On the suite's swarm (conftest.py), whose gateway started the guard (CORRAL_RUNTIME=swarm).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from corral.runtime.swarm import guardservice
from corral.sdk import Sandbox

from . import probes
from .conftest import Swarm, _run

PROXY_UID = "1001"
AGENT_UID = "1100"
DROPPED = {"timeout", "unreachable"}  # "refused" is an answer: whatever refused was reached


@pytest.fixture(scope="module")
def client(swarm: Swarm) -> docker.DockerClient:
    return swarm.manager


@pytest.fixture(scope="module")
def net(swarm: Swarm) -> str:
    return swarm.env["CORRAL_SWARM_NET"]


@pytest.fixture(scope="module")
def image(net: str) -> str:
    """The sandboxes' image in the swarm's registry: what the gateway runs the guard from."""
    return f"{net}.1:5000/corral-desktop:latest"


@pytest.fixture(scope="module")
def nodes(client: docker.DockerClient) -> list[str]:
    names = probes.node_names(client)
    assert len(names) >= 2, names
    return names


@pytest.fixture(scope="module")
def egress_net(client: docker.DockerClient) -> Iterator[str]:
    with probes.overlay(client, f"crl-guard-egress-{probes.suffix()}", internal=False) as name:
        yield name


@pytest.fixture(scope="module")
def session_net(client: docker.DockerClient) -> Iterator[str]:
    with probes.overlay(client, f"crl-guard-session-{probes.suffix()}", internal=True) as name:
        yield name


@pytest.fixture(scope="module")
def control(client: docker.DockerClient, image: str, egress_net: str) -> Iterator[str]:
    with probes.listener(client, image, egress_net, 8080) as name:
        yield f"tasks.{name}:8080"


def swarm_targets(net: str, node: str) -> list[str]:
    """Every node's gossip, the manager's control port and the registry, and the node itself
    through its bridge's address (the INPUT path) when it has that bridge yet."""
    targets = [f"{net}.{n}:7946" for n in (1, 2, 3)] + [f"{net}.1:2377", f"{net}.1:5000"]
    bridge = probes.bridge_address(node)
    return [*targets, f"{bridge}:7946"] if bridge else targets


@pytest.fixture(scope="module")
def guarded(client: docker.DockerClient, image: str) -> guardservice.GuardState:
    """The guard as the gateway keeps it (made at its start; the same arguments, so no update)."""
    state = guardservice.GuardKeeper(client, image).settle(limit_s=180)
    assert state.everywhere, state
    return state


def test_a_node_without_its_guard_is_open_to_a_proxy_and_takes_no_session(
    swarm: Swarm,
    client: docker.DockerClient,
    image: str,
    net: str,
    nodes: list[str],
    egress_net: str,
    control: str,
    guarded: guardservice.GuardState,
) -> None:
    """The threat, shown on one worker whose guard is taken away (the service gone, that node's rules
    removed; the others keep theirs, as a stopped guard leaves its rules), then the guard back."""
    worker = nodes[-1]
    client.services.get(guardservice.SERVICE).remove()
    try:
        node_socket = Path(swarm.env["CORRAL_SWARM_DIR"]) / worker.rsplit("-", 1)[1] / "docker.sock"
        probes.wait_no_task_of(guardservice.SERVICE, str(node_socket))  # else it syncs its rules back
        probes.remove_guard(client, image, worker)
        state = guardservice.relabel(client)
        assert worker in state.unguarded and guardservice.NODE_LABEL not in probes.labels_of(client, worker)
        seen = probes.probe(client, image, worker, egress_net, [control, *swarm_targets(net, worker)], user=PROXY_UID)
        assert seen[control] == "open"
        assert seen[f"{net}.1:2377"] == "open", seen  # a worker's task at the manager's control port
        assert seen[f"{net}.1:5000"] == "open", seen  # and at the registry's push
    finally:
        state = guardservice.GuardKeeper(client, image).settle(limit_s=180)
    assert state.everywhere and guardservice.NODE_LABEL in probes.labels_of(client, worker)


def test_the_guard_runs_on_every_node_and_labels_it(
    client: docker.DockerClient, nodes: list[str], guarded: guardservice.GuardState
) -> None:
    assert guarded.guarded == frozenset(nodes)
    for node in client.nodes.list():
        assert node.attrs["Spec"]["Labels"].get(guardservice.NODE_LABEL) == "on"


def test_a_proxy_on_any_node_reaches_no_node_s_services(
    client: docker.DockerClient,
    image: str,
    net: str,
    nodes: list[str],
    egress_net: str,
    control: str,
    guarded: guardservice.GuardState,
) -> None:
    for node in nodes:
        before = probes.drops(node)
        targets = swarm_targets(net, node)
        seen = probes.probe(client, image, node, egress_net, [control, *targets], user=PROXY_UID)
        assert seen[control] == "open", (node, seen)  # the overlay itself still works
        assert {target: seen[target] for target in targets if seen[target] not in DROPPED} == {}, node
        assert probes.drops(node) > before, node  # dropped by the guard's rules, not by chance


def test_an_agent_on_a_session_overlay_reaches_no_node_either(
    client: docker.DockerClient,
    image: str,
    net: str,
    nodes: list[str],
    session_net: str,
    guarded: guardservice.GuardState,
) -> None:
    for node in nodes:
        seen = probes.probe(client, image, node, session_net, swarm_targets(net, node), user=AGENT_UID)
        assert {target: result for target, result in seen.items() if result not in DROPPED} == {}, node


def test_a_guard_updated_with_new_addresses_keeps_blocking(
    client: docker.DockerClient,
    image: str,
    net: str,
    nodes: list[str],
    egress_net: str,
    control: str,
    guarded: guardservice.GuardState,
) -> None:
    """An update (a node joined, the registry moved) replaces every task: the rules stay in force
    across it, since a stopping guard leaves them and the new one syncs."""
    try:
        service = guardservice.ensure_service(client, image, registry="registry.corral.test:5000")
        assert "registry.corral.test" in service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Args"][1]
        seen = probes.probe(client, image, nodes[-1], egress_net, [control, f"{net}.1:2377"], user=PROXY_UID)
        assert seen == {control: "open", f"{net}.1:2377": "timeout"}
    finally:
        assert guardservice.GuardKeeper(client, image).settle(limit_s=180).everywhere  # the gateway's list again


@pytest.fixture(scope="module")
def lan_trusted(swarm: Swarm, net: str) -> Iterator[Swarm]:
    """The gateway again, its operator trusting the nodes' LAN for upstreams (an internal API lives
    there): the proxy then dials a node's address when the session's allowlist names it, and only the
    guard stands in the way. The gateway as it was afterwards."""
    env_file = Path(swarm.env["CORRAL_SWARM_DIR"]) / "gateway" / "env"
    before = env_file.read_text()
    trusted = before.replace("CORRAL_EGRESS_TRUSTED_NETWORKS=", f"CORRAL_EGRESS_TRUSTED_NETWORKS={net}.0/24,")
    assert trusted != before, before
    env_file.write_text(trusted)
    gateway = {**swarm.env, "CORRAL_SWARM_GATEWAY_ENV": str(env_file)}
    _run(gateway, "gateway", timeout=300)
    try:
        yield swarm
    finally:
        env_file.write_text(before)
        _run(gateway, "gateway", timeout=300)


def _proxy_node(swarm: Swarm, session_id: str) -> str:
    [proxy] = [
        s for s in swarm.manager.services.list(filters={"label": f"corral.session={session_id}"}) if "egress" in s.name
    ]
    [task] = swarm.manager.api.tasks(filters={"service": proxy.id, "desired-state": "running"})
    return str(swarm.manager.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"])


@pytest.mark.timeout(600)  # the gateway restarted twice around it (its fixture's setup and teardown)
def test_a_session_allowed_a_node_s_address_still_cannot_reach_it(
    lan_trusted: Swarm, net: str, guarded: guardservice.GuardState
) -> None:
    """The agent's own token, its allowlist naming the registry and the manager's control port, the
    operator trusting the nodes' LAN: the proxy dials (no policy refusal, 403) and the guard on the
    proxy's node drops it; around the proxy the sandbox has no way at all."""
    targets = [f"{net}.1:5000", f"{net}.1:2377"]
    with Sandbox.create(url=lan_trusted.url, api_key=lan_trusted.api_key, allow=targets) as box:
        node = _proxy_node(lan_trusted, box.id)
        before = probes.drops(node)
        for target in targets:
            through = box.exec(
                f"curl -sS --max-time 8 -o /dev/null -w 'status=%{{http_code}}\\n' http://{target}/v2/; echo exit=$?"
            )
            assert "status=403" not in through.stdout, (target, through)  # not the policy: the proxy dialled
            assert "status=200" not in through.stdout and "exit=0" not in through.stdout, (target, through)
            around = box.exec(f"curl -sS --max-time 4 --noproxy '*' http://{target}/v2/; echo exit=$?")
            assert "exit=0" not in around.stdout, (target, around)
        assert probes.drops(node) > before, node  # the guard's rules dropped the proxy's dials
