"""Commands' egress end to end: curl, Python, pip, npm and git, run by ``exec`` through the gateway
(as the agent, in the command environment of corral.sandbox.agent.agentenv), through the session's real
proxy to the fake upstream.

An allowed host answers over HTTPS trusted through the session's CA, a refused one gets the
refusal page, and every request is in the audit log under the action id of the command that made
it (a background process: the one that started it), never with its proxy credentials. All traffic
stays on this machine (the test's own Docker networks, names under .test)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


@dataclass(frozen=True)
class Ran:
    pid: int
    code: int | None  # None: started in the background
    output: str  # stdout
    errors: str  # stderr
    action_id: str  # the exec's, from its reply

    def __str__(self) -> str:
        return f"exit {self.code} ({self.action_id})\n{self.output}\n{self.errors}"


def run(sb: Sandbox, command: str, **options: Any) -> Ran:
    """``command`` by ``exec`` (``bash -lc``, as the agent) through the gateway's WebSocket."""
    reply = sb.act({"type": "exec", "command": command, "timeout_ms": 120_000, **options})
    result = reply["result"]
    output, errors = result.get("stdout", ""), result.get("stderr", "")
    return Ran(result["pid"], result.get("exit_code"), output, errors, reply["action_id"])


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-egress-cmd-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("cmd-gw"), f"cmd-egress-{os.getpid()}") as running:
        yield running


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
        yield box


def traffic(gw: RunningGateway, sb: Sandbox, **params: str) -> list[dict[str, Any]]:
    with gw.client(KEY_A) as c:
        response = c.get(f"/v1/sessions/{sb.id}/traffic", params=params)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line]


def of_action(gw: RunningGateway, sb: Sandbox, action_id: str) -> list[dict[str, Any]]:
    """The records charged to ``action_id``, each saying a command named it."""
    records = traffic(gw, sb, action=action_id)
    assert all(record.get("action_source") == "command" for record in records), records
    return records


def test_a_login_shell_finds_the_agent_s_programs_and_the_bundle(sb: Sandbox) -> None:
    ran = run(sb, 'echo "$PATH"; id -un; stat -c "%U:%a" "$SSL_CERT_FILE"; grep -c "BEGIN CERT" "$SSL_CERT_FILE"')
    path, user, mode, certificates = ran.output.split()
    assert ran.code == 0 and user == "agent"
    assert path.split(":")[0] == "/home/agent/.local/bin" and "/opt/corral" not in path
    assert mode == "root:644"  # root's: the agent reads it, and cannot add a CA of its own
    assert int(certificates) > 100  # Debian's roots and the session's CA
    # The session's CA is in it: every line of its certificate.
    ca = run(sb, 'grep -c -x -F -f <(grep -v -- ----- /run/corral/session-ca.pem) "$SSL_CERT_FILE"')
    lines = run(sb, "grep -c -v -- ----- /run/corral/session-ca.pem")
    assert ca.code == 0 and ca.output.strip() == lines.output.strip(), (ca.output, lines.output)


@pytest.mark.parametrize(
    ("client", "command"),
    [
        ("curl", "curl -sS --fail https://allowed.test/json?via=curl"),
        (
            "python",
            "python3 -c \"import urllib.request as u; print(u.urlopen('https://allowed.test/json?via=python').read().decode())\"",
        ),
    ],
)
def test_an_allowed_host_answers_over_https_through_the_session_ca(
    gw: RunningGateway, sb: Sandbox, client: str, command: str
) -> None:
    ran = run(sb, command)
    assert ran.code == 0, str(ran)
    answer = json.loads(ran.output.strip().splitlines()[-1])
    assert (answer["host"], answer["tls"], answer["path"]) == ("allowed.test", True, f"/json?via={client}")
    events = [(record["event"], record["host"], record["decision"]) for record in of_action(gw, sb, ran.action_id)]
    assert events == [("connect", "allowed.test", "allow"), ("request", "allowed.test", "allow")]


def test_a_refused_host_gets_the_refusal_page_and_a_block_record(gw: RunningGateway, sb: Sandbox) -> None:
    ran = run(sb, "curl -sS -w '\\nstatus=%{http_code}' https://other.test/private")
    assert ran.code == 0, str(ran)  # the refusal is an answer, over TLS the session's CA vouches for
    assert ran.output.rstrip().endswith("status=403") and "other.test" in ran.output
    (connect, block) = of_action(gw, sb, ran.action_id)
    assert (connect["event"], connect["decision"], connect["rule"]) == ("connect", "deny", "default-deny")
    assert (block["event"], block["status"], block["url"]) == ("block", 403, "https://other.test/private")


def test_without_the_proxy_nothing_gets_out(sb: Sandbox) -> None:
    ran = run(sb, "curl -sS --max-time 5 --noproxy '*' https://allowed.test/ ; echo exit=$?")
    assert "exit=0" not in ran.output and "exit=" in ran.output


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_proxy_credentials_never_reach_the_upstream_or_the_log(
    gw: RunningGateway, sb: Sandbox, scheme: str
) -> None:
    ran = run(sb, f"curl -sS --fail {scheme}://allowed.test/headers")
    assert ran.code == 0, str(ran)
    seen = json.loads(ran.output.strip().splitlines()[-1])
    assert seen["host"] == "allowed.test" and "proxy-authorization" not in seen
    (request,) = [r for r in of_action(gw, sb, ran.action_id) if r["event"] == "request"]
    assert request["url"] == f"{scheme}://allowed.test/headers"
    assert "proxy-authorization" not in {name.lower() for name, _ in request["request_headers"]}
    assert ran.action_id not in json.dumps(request["request_headers"])


def test_pip_installs_from_an_allowed_index_as_the_agent(gw: RunningGateway, sb: Sandbox) -> None:
    ran = run(
        sb,
        "pip install --no-cache-dir --index-url https://allowed.test/simple/ corral-probe"
        " && python3 -c 'import corral_probe; print(corral_probe.VALUE)'",
    )
    assert ran.code == 0, str(ran)
    assert ran.output.rstrip().endswith("served by the fake upstream")
    urls = {record["url"] for record in of_action(gw, sb, ran.action_id) if record["event"] == "request"}
    assert {
        "https://allowed.test/simple/corral-probe/",
        "https://allowed.test/files/corral_probe-1.0-py3-none-any.whl",
    } <= urls
    # Into the agent's ~/.local: a user install, the system's site-packages untouched.
    where = run(sb, "python3 -c 'import corral_probe; print(corral_probe.__file__)'; command -v corral-probe")
    module, program = where.output.split()
    assert module.startswith("/home/agent/.local/lib/python3") and program == "/home/agent/.local/bin/corral-probe"


def test_programs_installed_by_a_command_run_in_that_same_command(sb: Sandbox) -> None:
    # ~/.local/bin is on the login shell's PATH before it exists, and the home lets programs run.
    ran = run(
        sb,
        "rm -rf ~/.local; pip install -q --index-url https://allowed.test/simple/ corral-probe && corral-probe &&"
        " npm install -g -s --no-audit --no-fund --registry https://allowed.test/npm/ corral-probe && corral-probe-js",
    )
    assert ran.code == 0, str(ran)
    assert ran.output.splitlines()[-2:] == ["served by the fake upstream"] * 2
    # And an argv exec, which no shell starts, finds them on the command environment's PATH.
    direct = sb.act({"type": "exec", "argv": ["corral-probe-js"]})["result"]
    assert (direct["exit_code"], direct["stdout"]) == (0, "served by the fake upstream\n")


def test_npm_installs_from_an_allowed_registry(gw: RunningGateway, sb: Sandbox) -> None:
    ran = run(
        sb,
        "mkdir -p npm-probe && cd npm-probe"
        " && npm install --cache ./cache --no-audit --no-fund --registry https://allowed.test/npm/ corral-probe >&2"
        " && node -e 'console.log(require(\"corral-probe\"))'",
    )
    assert ran.code == 0, str(ran)
    assert ran.output.rstrip() == "served by the fake upstream"
    urls = {record["url"] for record in of_action(gw, sb, ran.action_id) if record["event"] == "request"}
    assert {
        "https://allowed.test/npm/corral-probe",
        "https://allowed.test/npm/corral-probe/-/corral-probe-1.0.0.tgz",
    } <= urls


def test_git_clones_over_https(gw: RunningGateway, sb: Sandbox) -> None:
    ran = run(sb, "git clone -q https://allowed.test/git/repo.git && cat repo/README")
    assert ran.code == 0, str(ran)
    assert ran.output.rstrip() == "served by the fake upstream"
    urls = [record["url"] for record in of_action(gw, sb, ran.action_id) if record["event"] == "request"]
    assert "https://allowed.test/git/repo.git/info/refs?service=git-upload-pack" in urls


def test_a_background_process_is_charged_to_the_action_that_started_it(gw: RunningGateway, sb: Sandbox) -> None:
    started = run(
        sb,
        "while [ ! -e go ]; do sleep 0.05; done; curl -sS --fail https://allowed.test/json?by=background",
        background=True,
    )
    assert started.code is None
    later = run(sb, "touch go; curl -sS --fail https://allowed.test/json?by=foreground")
    assert later.code == 0, str(later)
    waited = sb.act({"type": "process_wait", "pid": started.pid, "timeout_ms": 10_000})["result"]
    assert (waited["running"], waited["exit_code"]) == (False, 0), waited

    def urls(action_id: str) -> list[str]:
        return [r["url"] for r in of_action(gw, sb, action_id) if r["event"] == "request"]

    assert wait_for(lambda: urls(started.action_id)) == ["https://allowed.test/json?by=background"]
    assert urls(later.action_id) == ["https://allowed.test/json?by=foreground"]


def wait_for(predicate: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value
