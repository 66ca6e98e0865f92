"""A session's lifetime and environment against the real images and a real gateway: ``env`` at create in
exec, the persistent shell, a PTY command and the anthropic bash tool (as the agent, never a secret's
value); refusals that make nothing; ``PATCH timeout_s`` extending a session past its first expiry and
shortening one, over the maximum refused, the agent's own token refused; the new expiry and the env
kept across a gateway restart and a controller restart."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, gateway, traffic
from .vendor_fixtures import text_of, tool_result, tool_use

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

MAX_TIMEOUT_S = 900
ENV = {"APP_MODE": "staging-e7f3", "GREETING": "hello 'quoted' $world", "lower_name": "ok"}
SECRET_VALUE = "ghp_lifetime-secret-0123456789"


@pytest.fixture(scope="module")
def instance() -> str:
    return f"it-lifetime-{os.getpid()}"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness, instance: str) -> Iterator[RunningGateway]:
    with gateway(
        tmp_path_factory.mktemp("lifetime-gw"), instance, max_timeout_s=MAX_TIMEOUT_S, default_timeout_s=300
    ) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


def _bash_tool(sb: Sandbox, command: str) -> str:
    block = tool_use("bash", {"command": command})
    return text_of(tool_result(sb.request({"anthropic": block}), block))


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.25)


def _alive(gw: RunningGateway, session_id: str) -> bool:
    with gw.client() as c:
        return c.get(f"/v1/sessions/{session_id}").status_code == 200


def _printed(gw: RunningGateway, created: dict[str, Any], name: str) -> str | None:
    """``printenv name`` through a fresh connection with the session's token; None while it cannot run."""
    try:
        sb = Sandbox.attach(created["id"], created["token"], url=gw.url)  # close() leaves it running
    except Exception:  # the controller is restarting: no connection
        return None
    try:
        return sb.exec(argv=["printenv", name]).stdout
    except Exception:  # the connection was cut under it
        return None
    finally:
        sb.close()


def test_env_is_in_every_command_as_the_agent_and_shown_by_name_only(gw: RunningGateway) -> None:
    secrets = {"GITHUB_TOKEN": {"value": SECRET_VALUE, "allow": ["api.example.test"]}}
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["api.example.test"], env=ENV, secrets=secrets) as sb:
        assert sb.info.env == sorted(ENV)
        printed = sb.exec(argv=["printenv", "APP_MODE"])
        assert (printed.exit_code, printed.stdout) == (0, "staging-e7f3\n")
        login = sb.exec('echo "$(id -un) $GREETING $lower_name"')  # bash -lc: the profile keeps them
        assert login.stdout == "agent hello 'quoted' $world ok\n"
        shell = sb.act({"type": "shell", "command": 'echo "[$APP_MODE] [$GREETING]"'})["result"]
        assert shell["output"].strip() == "[staging-e7f3] [hello 'quoted' $world]"
        pty = sb.act(
            {"type": "exec", "command": 'tty >/dev/null && echo "pty $APP_MODE"', "pty": {"rows": 24, "cols": 80}}
        )
        assert pty["result"]["exit_code"] == 0 and "pty staging-e7f3" in pty["result"]["stdout"]
        assert _bash_tool(sb, 'echo "$(id -un) $APP_MODE"').strip() == "agent staging-e7f3"
        # The secret beside it stays brokered: its placeholder in the environment, never the value.
        held = sb.exec("printenv GITHUB_TOKEN").stdout.strip()
        assert held == sb.secrets["GITHUB_TOKEN"] and held != SECRET_VALUE
        # The exec's own env has the last word.
        assert sb.exec("echo $APP_MODE", env={"APP_MODE": "mine"}).stdout == "mine\n"
        with gw.client() as c:
            shown = c.get(f"/v1/sessions/{sb.id}")
            listed = c.get("/v1/sessions")
        assert shown.json()["env"] == sorted(ENV)
        for answer in (shown, listed):
            assert "staging-e7f3" not in answer.text and "quoted" not in answer.text


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"env": {"PATH": "/tmp/evil"}}, "env.PATH", "reserved"),
        ({"env": {"https_proxy": "http://evil.invalid:8080"}}, "env.https_proxy", "reserved"),
        (
            {
                "env": {"TOKEN_COPY": SECRET_VALUE},
                "secrets": {"GITHUB_TOKEN": {"value": SECRET_VALUE, "allow": ["api.example.test"]}},
            },
            "env.TOKEN_COPY",
            "secrets stay brokered",
        ),
    ],
)
def test_a_refused_env_is_a_structured_error_and_nothing_is_made(
    gw: RunningGateway, runtime: DockerHarness, instance: str, body: dict[str, Any], field: str, words: str
) -> None:
    before = runtime.container_states({"corral.gateway": instance})
    with gw.client() as c:
        sessions_before = c.get("/v1/sessions").json()
        refused = c.post("/v1/sessions", json={"allow": ["api.example.test"], **body})
        sessions_after = c.get("/v1/sessions").json()
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_request", field) and words in error["message"]
    assert SECRET_VALUE not in refused.text and "/tmp/evil" not in refused.text
    assert [s["id"] for s in sessions_after] == [s["id"] for s in sessions_before]
    assert runtime.container_states({"corral.gateway": instance}) == before  # no sandbox, no proxy started


def test_patch_timeout_extends_past_the_first_expiry_then_shortens_and_is_audited(gw: RunningGateway) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["api.example.test"], timeout_s=3) as sb:
        first = sb.info.expires_at
        extended = sb.set_timeout(120)
        assert extended > first + 100
        # Past the first expiry, and a few reaper ticks (0.25 s each) beyond: still alive, still working.
        time.sleep(max(0.0, first - time.time()) + 2.0)
        assert _alive(gw, sb.id) and sb.exec("echo still").stdout == "still\n"
        shortened = sb.set_timeout(2)
        assert shortened < extended
        _wait(lambda: not _alive(gw, sb.id), 15, "the shortened session did not end")
        ended_at = time.time()
        assert ended_at >= shortened - 0.5
        records = traffic(gw, sb.id, event="lifetime")
        assert [(r["expires_at"], r["previous_expires_at"], r["actor"]) for r in records] == [
            (extended, first, "api-key:owner"),
            (shortened, extended, "api-key:owner"),
        ]


def test_over_the_maximum_and_the_agents_own_token_change_nothing(gw: RunningGateway) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["api.example.test"], timeout_s=60) as sb:
        with gw.client() as owner:
            over = owner.patch(f"/v1/sessions/{sb.id}", json={"timeout_s": MAX_TIMEOUT_S + 1})
            after = owner.get(f"/v1/sessions/{sb.id}").json()
        assert over.status_code == 422
        error = over.json()["error"]
        assert (error["code"], error["field"]) == ("invalid_request", "timeout_s")
        assert f"at most {MAX_TIMEOUT_S}" in error["message"]
        assert after["expires_at"] == sb.info.expires_at
        assert traffic(gw, sb.id, event="lifetime") == []
    # The attack: the agent, with its own session token, tries to outlive its owner's limit.
    with gw.client() as owner:
        created = owner.post("/v1/sessions", json={"allow": ["api.example.test"], "timeout_s": 60}).json()
    try:
        path = f"/v1/sessions/{created['id']}"
        with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {created['token']}"}) as agent:
            for body in ({"timeout_s": MAX_TIMEOUT_S}, {"timeout_s": 1}, {"env": {"APP_MODE": "x"}}):
                refused = agent.patch(path, json=body)
                assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden", refused.text
        with gw.client() as owner:
            assert owner.get(path).json()["expires_at"] == created["expires_at"]
        assert traffic(gw, created["id"], event="lifetime") == []
    finally:
        with gw.client() as owner:
            owner.delete(f"/v1/sessions/{created['id']}")


def test_a_restarted_gateway_keeps_the_new_expiry_and_a_restarted_controller_gets_its_env_back(
    tmp_path: Path, runtime: DockerHarness
) -> None:
    instance = f"it-lifetime-restart-{os.getpid()}"
    data_dir = tmp_path / "gw"
    try:
        with gateway(data_dir, instance, max_timeout_s=MAX_TIMEOUT_S, default_timeout_s=300) as first:
            with first.client() as c:
                created = c.post("/v1/sessions", json={"timeout_s": 30, "env": ENV}).json()
                changed = c.patch(f"/v1/sessions/{created['id']}", json={"timeout_s": 600})
            assert changed.status_code == 200, changed.text
            expires_at = changed.json()["expires_at"]
        with gateway(data_dir, instance, max_timeout_s=MAX_TIMEOUT_S, default_timeout_s=300) as second:
            with second.client() as c:
                adopted = c.get(f"/v1/sessions/{created['id']}")
            assert adopted.status_code == 200, adopted.text
            assert adopted.json()["expires_at"] == expires_at and adopted.json()["env"] == sorted(ENV)
            assert _printed(second, created, "APP_MODE") == "staging-e7f3\n"
            # The controller restarted inside its container holds no env; the gateway's watchdog puts
            # it back from the record (the values outlived the first gateway's memory).
            code, out = runtime.exec(
                adopted.json()["container"], ["pkill", "-f", "corral.sandbox.controller"], "corral"
            )
            assert code == 0, out
            _wait(lambda: _printed(second, created, "APP_MODE") == "staging-e7f3\n", 60, "the env did not come back")
    finally:
        runtime.remove_all({"corral.gateway": instance})


# Run inside the sandbox: PUT /v1/env to the controller's port at 127.0.0.1, unsigned and with a
# made-up signature. Prints one JSON object: spelling -> the answer's status line, or the error.
PUT_OWN_ENV = r"""
import json, os, socket
body = json.dumps({"env": {"APP_MODE": "attacker"}}).encode()
extra = {"forged": "x-corral-auth: v1.1700000000.bm9uY2U." + "0" * 64 + "\r\n", "unsigned": ""}
seen = {"uid": os.getuid()}
for spelling, header in extra.items():
    request = (
        f"PUT /v1/env HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{header}"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body
    try:
        with socket.create_connection(("127.0.0.1", 8765), timeout=3) as conn:
            conn.sendall(request)
            seen[spelling] = conn.recv(4096).decode(errors="replace").split("\r\n")[0]
    except OSError as exc:
        seen[spelling] = type(exc).__name__
print(json.dumps(seen))
"""


def test_the_agent_cannot_change_its_env_from_inside(gw: RunningGateway, runtime: DockerHarness) -> None:
    """The attack: a command of the agent's uid PUTs its own env to the controller. The firewall
    refuses the connection; past it (root, which no command of the agent's is), the controller's door
    refuses an unsigned or forged request. (The gateway refuses its token: the test above.)"""
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["api.example.test"], env=ENV) as sb:
        seen: dict[str, Any] = {}
        for user in ("agent", "root"):
            code, out = runtime.exec(sb.container, ["python3", "-c", PUT_OWN_ENV], user=user)
            assert code == 0, out
            seen[user] = json.loads(out.strip().splitlines()[-1])
        assert seen["agent"] == {"uid": 1100, "forged": "ConnectionRefusedError", "unsigned": "ConnectionRefusedError"}
        assert seen["root"]["forged"].startswith("HTTP/1.1 401") and seen["root"]["unsigned"].startswith("HTTP/1.1 401")
        assert sb.exec("printenv APP_MODE").stdout == "staging-e7f3\n"  # unchanged
