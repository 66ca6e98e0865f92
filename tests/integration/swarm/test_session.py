"""A session on a real swarm, end to end through the gateway's container on the manager: its sandbox
and proxy are services placed by Swarm, the agent's command runs, the screen is read, the browser
reaches a fake upstream (a service on the egress overlay) through the session's proxy, which refuses
what the allowlist does not allow and logs both; and nothing of the session is left once it ends."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral.sdk import Sandbox

from .conftest import Swarm


@pytest.fixture(scope="module")
def session(swarm: Swarm) -> Iterator[Sandbox]:
    with Sandbox.create(url=swarm.url, api_key=swarm.api_key, allow=["allowed.test"]) as box:
        yield box


def _services(swarm: Swarm, session_id: str) -> list[Any]:
    return swarm.manager.services.list(filters={"label": f"corral.session={session_id}"})


def _task_node(swarm: Swarm, service_name: str) -> str:
    [task] = swarm.manager.api.tasks(filters={"service": service_name, "desired-state": "running"})
    node = swarm.manager.nodes.get(task["NodeID"])
    return str(node.attrs["Description"]["Hostname"])


def _record(swarm: Swarm, session_id: str) -> dict[str, Any]:
    with swarm.client() as c:
        response = c.get(f"/v1/sessions/{session_id}")
    assert response.status_code == 200, response.text
    record: dict[str, Any] = response.json()
    return record


def test_a_session_runs_on_a_node_of_the_swarm_and_the_agents_command_runs(swarm: Swarm, session: Sandbox) -> None:
    result = session.exec(
        ["sh", "-c", "id -un; cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max"]
    )
    assert result.exit_code == 0, result
    user, pids = result.stdout.split()
    assert user == "agent" and pids.isdigit()  # the agent's uid, and a pids limit (the service's) rather than "max"
    sandbox = _record(swarm, session.id)["container"]
    labels = swarm.manager.services.get(sandbox).attrs["Spec"]["Labels"]
    assert labels["corral.role"] == "sandbox"
    assert _task_node(swarm, sandbox) in swarm.nodes()


def test_the_screen_is_read_through_the_gateway(session: Sandbox) -> None:
    png = session.screenshot()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_the_agents_uid_cannot_gain_privileges_and_its_home_runs_what_it_installs(session: Sandbox) -> None:
    """Boot's no_new_privs (no service option for it on Docker 20.10), and the agent's tmpfs mounts its own and exec."""
    result = session.exec(
        [
            "sh",
            "-c",
            "grep NoNewPrivs /proc/self/status; stat -c %U /home/agent /workspace; "
            "printf '#!/bin/sh\\necho ran\\n' > /workspace/x.sh && chmod +x /workspace/x.sh && /workspace/x.sh",
        ]
    )
    assert result.exit_code == 0, result
    assert result.stdout.split() == ["NoNewPrivs:", "1", "agent", "agent", "ran"]


def test_the_controllers_secret_is_none_of_the_agents(session: Sandbox) -> None:
    result = session.exec(["sh", "-c", "cat /run/corral/controller/secret; ls /run/secrets 2>&1; echo done"])
    assert "Permission denied" in result.stderr + result.stdout and result.stdout.strip().endswith("done")
    assert result.stdout.count("\n") <= 3  # nothing of the secret itself


def test_egress_reaches_an_allowed_upstream_on_the_swarm_and_refuses_another(session: Sandbox) -> None:
    """Through the session's proxy (a service on some node) to the fake upstream (a service on the
    egress overlay), over TLS the session's CA vouches for; refused with the proxy's 403 page."""
    allowed = session.exec("curl -sS --fail --max-time 30 https://allowed.test/json?via=swarm")
    assert allowed.exit_code == 0, allowed
    answer = json.loads(allowed.stdout.strip().splitlines()[-1])
    assert (answer["host"], answer["tls"], answer["path"]) == ("allowed.test", True, "/json?via=swarm")
    refused = session.exec("curl -sS --max-time 30 -w '\\nstatus=%{http_code}' https://other.test/private")
    assert refused.exit_code == 0, refused
    assert refused.stdout.rstrip().endswith("status=403") and "other.test" in refused.stdout
    around = session.exec("curl -sS --max-time 5 --noproxy '*' https://allowed.test/ ; echo exit=$?")
    assert "exit=0" not in around.stdout  # nothing around the proxy: the sandbox's firewall holds on the node


def test_the_proxys_audit_reaches_the_gateway(swarm: Swarm, session: Sandbox) -> None:
    session.exec("curl -sS --max-time 30 https://allowed.test/audited")
    deadline = time.monotonic() + 20
    while True:
        with swarm.client() as c:
            response = c.get(f"/v1/sessions/{session.id}/traffic")
        records = [json.loads(line) for line in response.text.splitlines() if line]
        if any(r.get("url") == "https://allowed.test/audited" for r in records):
            break
        assert time.monotonic() < deadline, records
        time.sleep(0.5)
    request = next(r for r in records if r.get("url") == "https://allowed.test/audited")
    assert request["ip"] == swarm.upstream_address and request["decision"] == "allow"


def test_an_ended_session_leaves_no_service_network_or_secret(swarm: Swarm) -> None:
    with Sandbox.create(url=swarm.url, api_key=swarm.api_key, allow=[]) as box:
        session_id, sandbox = box.id, _record(swarm, box.id)["container"]
        [proxy] = _services(swarm, session_id)
        names = {sandbox, proxy.name}
        assert {
            s.name for s in swarm.manager.secrets.list() if s.name.startswith(tuple(names))
        }  # theirs, while they run
    deadline = time.monotonic() + 30
    while True:
        left = (
            [s.name for s in swarm.manager.services.list() if s.name in names],
            swarm.manager.networks.list(filters={"label": f"corral.session={session_id}"}),
            [s.name for s in swarm.manager.secrets.list() if s.name.startswith(tuple(names))],
        )
        if left == ([], [], []):
            break
        assert time.monotonic() < deadline, left
        time.sleep(0.5)
