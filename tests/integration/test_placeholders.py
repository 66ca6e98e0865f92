"""The session's secret placeholders in the real sandbox: put by a caller signing as the gateway does,
in every command's environment and in the ``secrets`` action's answer; and a process of the agent's
uid that tries to put its own, attacked for real, changes nothing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from corral.client import SandboxClient
from corral.contracts import auth
from corral.contracts.placeholders import new_placeholder
from corral.runtime import SandboxAddress
from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway

# Run inside the sandbox: PUT /v1/secrets to the controller's port at each host in argv[1] (JSON), in
# each spelling in argv[2]: with a made-up signature, with none, and as a browser would. Prints one
# JSON object: host and spelling -> the answer's status line, or the error that stopped it.
PUT_OWN_PLACEHOLDERS = r"""
import json, socket, sys
hosts, spellings = json.loads(sys.argv[1]), json.loads(sys.argv[2])
body = json.dumps({"secrets": {"GITHUB_TOKEN": "corral_secret_" + "e" * 32}}).encode()
extra = {
    "forged": "x-corral-auth: v1.1700000000.bm9uY2U." + "0" * 64 + "\r\n",
    "unsigned": "",
    "browser": "origin: https://allowed.test\r\nsec-fetch-site: cross-site\r\n",
}
hosts = [socket.gethostbyname(socket.gethostname()) if host == "own-address" else host for host in hosts]
seen = {"uid": __import__("os").getuid()}
for host in hosts:
    for spelling in spellings:
        request = (
            f"PUT /v1/secrets HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n{extra[spelling]}"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode() + body
        try:
            with socket.create_connection((host, 8765), timeout=3) as conn:
                conn.sendall(request)
                seen[f"{host} {spelling}"] = conn.recv(4096).decode(errors="replace").split("\r\n")[0]
        except OSError as exc:
            seen[f"{host} {spelling}"] = type(exc).__name__
print(json.dumps(seen))
"""


def _put(box: SandboxAddress, placeholders: dict[str, str]) -> httpx.Response:
    """``PUT /v1/secrets`` as the gateway sends it: signed with the controller's per-boot secret."""
    signed = auth.sign(box.secret)
    with httpx.Client(base_url=box.base_url, timeout=30) as http:
        response = http.put("/v1/secrets", json={"secrets": placeholders}, headers=signed.headers)
    assert auth.proven(box.secret, signed.nonce, response.headers)
    return response


def _printenv(client: SandboxClient, name: str) -> dict[str, Any]:
    result: dict[str, Any] = client.act({"type": "exec", "argv": ["printenv", name]})["result"]
    return result


def _attack(runtime: DockerHarness, box: SandboxAddress, user: str, hosts: list[str]) -> dict[str, Any]:
    spellings = json.dumps(["forged", "unsigned", "browser"])
    argv = ["python", "-c", PUT_OWN_PLACEHOLDERS, json.dumps(hosts), spellings]
    code, out = runtime.exec(box.id, argv, user=user)
    assert code == 0, out
    seen: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return seen


@pytest.fixture()
def placeholders(sandbox: SandboxAddress) -> Iterator[dict[str, str]]:
    """The session's set, put as the gateway would; none again afterwards (the sandbox is shared)."""
    given = {"GITHUB_TOKEN": new_placeholder(), "NPM_TOKEN": new_placeholder()}
    response = _put(sandbox, given)
    assert response.status_code == 200, response.text
    assert response.json() == {"ok": True, "secrets": given}
    yield given
    assert _put(sandbox, {}).status_code == 200


def test_every_command_gets_the_placeholders_and_the_secrets_action_answers_them(
    client: SandboxClient, sandbox: SandboxAddress, placeholders: dict[str, str]
) -> None:
    printed = _printenv(client, "GITHUB_TOKEN")
    assert (printed["exit_code"], printed["stdout"]) == (0, placeholders["GITHUB_TOKEN"] + "\n")
    # Through bash's login shell too (its profile must not lose them), and under the agent's own uid.
    shell = client.act({"type": "exec", "command": 'echo "$(id -un) $NPM_TOKEN"'})["result"]
    assert shell["stdout"] == f"agent {placeholders['NPM_TOKEN']}\n"
    # The exec's own env has the last word.
    mine = client.act({"type": "exec", "argv": ["printenv", "NPM_TOKEN"], "env": {"NPM_TOKEN": "mine"}})["result"]
    assert mine["stdout"] == "mine\n"
    assert client.act({"type": "secrets"})["result"] == {"secrets": placeholders}
    # The whole set each time: GITHUB_TOKEN revoked is gone from the next command's environment.
    assert _put(sandbox, {"NPM_TOKEN": placeholders["NPM_TOKEN"]}).status_code == 200
    assert _printenv(client, "GITHUB_TOKEN")["exit_code"] == 1
    assert _printenv(client, "NPM_TOKEN")["stdout"] == placeholders["NPM_TOKEN"] + "\n"
    assert client.act({"type": "secrets"})["result"] == {"secrets": {"NPM_TOKEN": placeholders["NPM_TOKEN"]}}


def test_a_bad_set_is_refused_with_its_field_and_changes_nothing(
    client: SandboxClient, sandbox: SandboxAddress, placeholders: dict[str, str]
) -> None:
    response = _put(sandbox, {"LD_PRELOAD": new_placeholder()})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_field", "secrets.LD_PRELOAD")
    response = _put(sandbox, {"GITHUB_TOKEN": "ghp_a_real_value_by_mistake"})
    assert response.status_code == 400 and response.json()["error"]["field"] == "secrets.GITHUB_TOKEN"
    assert "ghp_a_real_value_by_mistake" not in response.text
    assert client.act({"type": "secrets"})["result"] == {"secrets": placeholders}


def test_the_agent_uid_cannot_put_its_own_placeholders(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness, placeholders: dict[str, str]
) -> None:
    # A command of the agent's (here started as the agent's uid, as the launcher starts them) tries
    # to replace the session's placeholders: every spelling of the controller's address, with a
    # made-up signature, with none, and as a browser. The firewall refuses the connection itself.
    seen = _attack(runtime, sandbox, "agent", ["127.0.0.1", "localhost", "::1", "own-address"])
    assert seen["uid"] == 1100
    attempts = {key: value for key, value in seen.items() if key != "uid"}
    assert len(attempts) == 12, seen
    assert not any(str(value).startswith("HTTP/") for value in attempts.values()), seen
    for spelling in ("forged", "unsigned", "browser"):
        assert seen[f"127.0.0.1 {spelling}"] == "ConnectionRefusedError", seen
    # Past the firewall (root, which no command of the agent's is), the controller's door refuses
    # each: no valid signature, 401; a browser's marks, 403.
    past = _attack(runtime, sandbox, "root", ["127.0.0.1"])
    assert past["uid"] == 0
    assert past["127.0.0.1 forged"].startswith("HTTP/1.1 401"), past
    assert past["127.0.0.1 unsigned"].startswith("HTTP/1.1 401"), past
    assert past["127.0.0.1 browser"].startswith("HTTP/1.1 403"), past
    # The session still has the gateway's placeholders, in the action's answer and in commands.
    assert client.act({"type": "secrets"})["result"] == {"secrets": placeholders}
    assert _printenv(client, "GITHUB_TOKEN")["stdout"] == placeholders["GITHUB_TOKEN"] + "\n"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-egress-ph-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("ph-gw"), f"ph-{os.getpid()}") as running:
        yield running


@pytest.mark.usefixtures("desktop_image", "egress_image")
def test_with_egress_control_the_placeholders_come_beside_the_proxy_and_ca_variables(
    gw: RunningGateway, runtime: DockerHarness
) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        box = runtime.find(sb.container)
        assert box is not None
        given = {"GITHUB_TOKEN": new_placeholder()}
        assert _put(box, given).status_code == 200
        reply = sb.act({"type": "exec", "argv": ["printenv", "GITHUB_TOKEN", "HTTPS_PROXY", "SSL_CERT_FILE"]})
        token, proxy, bundle = reply["result"]["stdout"].splitlines()
        assert token == given["GITHUB_TOKEN"]
        assert proxy.startswith(f"http://corral-action:{reply['action_id']}@") and bundle.startswith("/")
        # The agent's own channel, relayed by the gateway, reads them; it has no way to set them.
        assert sb.act({"type": "secrets"})["result"] == {"secrets": given}
