"""What the swarm tests do to a swarm's Docker that no runtime does: probes, one-task services on a
chosen node that try to connect to addresses and print what happened, and a listener to reach.

A probe connects to every target at once (bounded: 3 s each) and prints one line
`PROBE {"host:port": "open" | "refused" | "timeout" | "unreachable" | "<errno name>"}`. Only
"timeout" and "unreachable" mean the packets went nowhere: "refused" is an answer, so a host that
refuses was reached.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import docker
from docker.types import EndpointSpec, Healthcheck, RestartPolicy, ServiceMode

PROBE_S = 3.0
DONE = {"complete", "failed", "rejected", "shutdown", "orphaned"}

PROBE = """
import asyncio, errno, json, sys
async def one(target):
    host, port = target.rsplit(":", 1)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), float(sys.argv[1]))
    except asyncio.TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "unreachable"
        return errno.errorcode.get(exc.errno or 0, str(exc))
    writer.close()
    return "open"
async def main():
    targets = sys.argv[2:]
    results = await asyncio.gather(*(one(t) for t in targets))
    print("PROBE " + json.dumps(dict(zip(targets, results))), flush=True)
asyncio.run(main())
"""


def suffix() -> str:
    return uuid.uuid4().hex[:8]


@contextmanager
def overlay(client: docker.DockerClient, name: str, *, internal: bool) -> Iterator[str]:
    network = client.networks.create(name, driver="overlay", attachable=True, internal=internal)
    try:
        yield name
    finally:
        network.remove()


def _wait_done(client: docker.DockerClient, service_id: str, limit_s: float) -> dict[str, object]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        tasks = client.api.tasks(filters={"service": service_id})
        if tasks and tasks[0]["Status"]["State"] in DONE:
            return dict(tasks[0]["Status"])
        time.sleep(0.5)
    raise AssertionError(f"probe {service_id} did not finish within {limit_s} s")


def probe(
    client: docker.DockerClient,
    image: str,
    node: str,
    network: str,
    targets: Sequence[str],
    *,
    user: str = "1001",
) -> dict[str, str]:
    """Run a probe as ``user`` on ``node`` (a host name) attached to ``network``; its results."""
    service = client.services.create(
        image,
        command=["python", "-I", "-c", PROBE],
        args=[str(PROBE_S), *targets],
        name=f"crl-guard-probe-{suffix()}",
        networks=[network],
        user=user,
        constraints=[f"node.hostname=={node}"],
        restart_policy=RestartPolicy(condition="none"),
        healthcheck=Healthcheck(test=["NONE"]),
        labels={"corral.test": "probe"},
    )
    try:
        status = _wait_done(client, service.id, 120)
        logs = b"".join(client.api.service_logs(service.id, stdout=True, stderr=True, follow=False))
        for line in logs.decode(errors="replace").splitlines():
            if line.startswith("PROBE "):
                result: dict[str, str] = json.loads(line.removeprefix("PROBE "))
                return result
        raise AssertionError(f"probe on {node} printed no result: {status} {logs[-2000:]!r}")
    finally:
        service.remove()


@contextmanager
def listener(client: docker.DockerClient, image: str, network: str, port: int) -> Iterator[str]:
    """A plain TCP listener on ``network`` (the control a probe must reach): its service name."""
    name = f"crl-guard-listen-{suffix()}"
    service = client.services.create(
        image,
        command=["python", "-I", "-m", "http.server", str(port), "--bind", "0.0.0.0"],
        name=name,
        networks=[network],
        user="1001",
        workdir="/tmp",
        mode=ServiceMode("replicated", 1),
        # dnsrr: the name answers with the task's own address. A VIP (IPVS) did not answer on the test
        # swarm's namespaced nodes, and nothing of Corral uses one.
        endpoint_spec=EndpointSpec(mode="dnsrr"),
        restart_policy=RestartPolicy(condition="none"),
        healthcheck=Healthcheck(test=["NONE"]),
        labels={"corral.test": "listener"},
    )
    try:
        deadline = time.monotonic() + 120
        while not any(t["Status"]["State"] == "running" for t in client.api.tasks(filters={"service": service.id})):
            assert time.monotonic() < deadline, "the listener did not start"
            time.sleep(0.5)
        yield name
    finally:
        service.remove()


def node_names(client: docker.DockerClient) -> list[str]:
    return sorted(node.attrs["Description"]["Hostname"] for node in client.nodes.list())


def drops(namespace: str) -> int:
    """Packets the node guard's FORWARD drops and the INPUT guard's DROP counted in ``namespace``."""
    total = 0
    for chain in ("DOCKER-USER", "INPUT"):
        listed = subprocess.run(
            ["nsenter", f"--net=/run/netns/{namespace}", "iptables", "-w", "-L", chain, "-v", "-n", "-x"],
            capture_output=True,
            text=True,
            check=False,
        )
        for line in listed.stdout.splitlines():
            words = line.split()
            if len(words) > 2 and words[2] == "DROP" and ("corral-nodeguard" in line or "corral-hostguard" in line):
                total += int(words[0])
    return total


def bridge_address(namespace: str, interface: str = "docker_gwbridge") -> str | None:
    """The node's own address on ``interface`` (what a task's default route points at), if it has one."""
    shown = subprocess.run(
        ["nsenter", f"--net=/run/netns/{namespace}", "ip", "-4", "-o", "addr", "show", "dev", interface],
        capture_output=True,
        text=True,
        check=False,
    )
    words = shown.stdout.split()
    return words[words.index("inet") + 1].split("/")[0] if "inet" in words else None


def labels_of(client: docker.DockerClient, node: str) -> dict[str, str]:
    [found] = [n for n in client.nodes.list() if n.attrs["Description"]["Hostname"] == node]
    return dict(found.attrs["Spec"].get("Labels") or {})


def remove_guard(client: docker.DockerClient, image: str, node: str) -> None:
    """``nodeguard --remove`` on ``node`` (its own namespace, as the guard runs): its rules gone."""
    service = client.services.create(
        image,
        command=["python", "-P", "-m", "corral.runtime.nodeguard", "--remove"],
        name=f"crl-guard-remove-{suffix()}",
        networks=["host"],
        user="root",
        cap_add=["CAP_NET_ADMIN", "CAP_NET_RAW"],
        constraints=[f"node.hostname=={node}"],
        restart_policy=RestartPolicy(condition="none"),
        healthcheck=Healthcheck(test=["NONE"]),
        labels={"corral.test": "remove-guard"},
    )
    try:
        status = _wait_done(client, service.id, 120)
        assert status["State"] == "complete", status
    finally:
        service.remove()


def wait_no_task_of(service_name: str, node_socket: str, limit_s: float = 60) -> None:
    """Until no container of ``service_name`` runs on the node behind ``node_socket`` (a removed
    service's task stops a moment after the service is gone)."""
    engine = docker.DockerClient(base_url=f"unix://{node_socket}", timeout=30)
    try:
        deadline = time.monotonic() + limit_s
        while engine.containers.list(filters={"label": f"com.docker.swarm.service.name={service_name}"}):
            assert time.monotonic() < deadline, f"{service_name} still runs behind {node_socket}"
            time.sleep(0.5)
    finally:
        engine.close()
