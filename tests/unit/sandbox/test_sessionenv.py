"""The session's env on the sandbox's side: the controller's ``PUT``/``GET /v1/env`` (its own checks:
it trusts no malformed body), and every command's environment holding it, under what Corral sets and
the placeholders."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.contracts import auth, envvars
from corral.contracts.placeholders import new_placeholder
from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.sandbox.agent import agentenv
from corral.sandbox.agent.processes import ProcessSettings, ProcessTable, RunContext
from corral.sandbox.placeholders import Placeholders
from corral.sandbox.sessionenv import SessionEnv, env_of

from .agent.test_processes import FakeLauncher, exec_action, prints, ran
from .test_app import JSON, SECRET, _controller

ENV = {"APP_MODE": "staging", "greeting": "hello world"}


def _put_env(client: Any, body: Any) -> Any:
    signed = auth.sign(SECRET)
    reply = client.put("/v1/env", content=json.dumps(body), headers={**JSON, **signed.headers})
    assert auth.proven(SECRET, signed.nonce, reply.headers)
    return reply


def test_a_set_is_replaced_whole_and_its_digest_names_no_value() -> None:
    held = SessionEnv()
    assert dict(held.by_name) == {} and held.digest() == envvars.digest({})
    held.replace(ENV)
    before = held.by_name
    held.replace({"APP_MODE": "prod"})
    assert dict(before) == ENV and dict(held.by_name) == {"APP_MODE": "prod"}
    assert held.digest() == envvars.digest({"APP_MODE": "prod"}) != envvars.digest(ENV)
    assert envvars.digest({"A": "1", "B": "2"}) == envvars.digest({"B": "2", "A": "1"})  # order-free
    with pytest.raises(TypeError):
        held.by_name["X"] = "1"  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({}, ErrorCode.MISSING_FIELD, "env"),
        ({"env": {}, "values": {}}, ErrorCode.UNKNOWN_FIELD, "values"),
        ({"env": ["A"]}, ErrorCode.INVALID_FIELD, "env"),
        ({"env": {"A": 1}}, ErrorCode.INVALID_FIELD, "env.A"),
        ({"env": {"PATH": "/tmp/evil"}}, ErrorCode.INVALID_FIELD, "env.PATH"),
        ({"env": {"https_proxy": "http://evil.invalid"}}, ErrorCode.INVALID_FIELD, "env.https_proxy"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, ErrorCode.INVALID_FIELD, "env.LD_PRELOAD"),
        ({"env": {"BASH_ENV": "/tmp/x"}}, ErrorCode.INVALID_FIELD, "env.BASH_ENV"),
        ({"env": {"CORRAL_PROXY": "x"}}, ErrorCode.INVALID_FIELD, "env.CORRAL_PROXY"),
        ({"env": {"A=B": "x"}}, ErrorCode.INVALID_FIELD, "env.A=B"),
        ({"env": {"A": "a\0b"}}, ErrorCode.INVALID_FIELD, "env.A"),
        ({"env": {"A": "\udcff"}}, ErrorCode.INVALID_FIELD, "env.A"),
        ({"env": {"A": "x" * (envvars.MAX_VALUE_BYTES + 1)}}, ErrorCode.INVALID_FIELD, "env.A"),
        ({"env": {f"V{i}": "x" for i in range(envvars.MAX_VARS + 1)}}, ErrorCode.INVALID_FIELD, "env"),
        ({"env": {f"V{i}": "x" * 8000 for i in range(5)}}, ErrorCode.INVALID_FIELD, "env"),
    ],
)
def test_a_bad_body_is_refused_with_its_field_never_quoting_a_value(
    body: dict[str, Any], code: ErrorCode, field: str
) -> None:
    with pytest.raises(ActionError) as caught:
        env_of(body)
    assert (caught.value.code, caught.value.field) == (code, field)
    assert "/tmp/evil" not in caught.value.message and "x" * 32 not in caught.value.message


def test_the_limits_hold_at_their_edges() -> None:
    most = {f"V{i}": "x" for i in range(envvars.MAX_VARS)}
    assert env_of({"env": most}) == most
    assert env_of({"env": {"N" * envvars.MAX_NAME_CHARS: "x" * envvars.MAX_VALUE_BYTES}})
    assert env_of({"env": {"lower_case": "ok", "_X": "", "MULTI": "a\nb"}})["MULTI"] == "a\nb"


def test_the_controller_takes_the_whole_set_answers_names_and_a_digest_and_refuses_a_bad_one() -> None:
    client, desktop = _controller()
    empty = client.get("/v1/env", headers=auth.sign(SECRET).headers)  # a restarted controller holds none
    assert empty.json() == {"ok": True, "names": [], "digest": envvars.digest({})}
    put = _put_env(client, {"env": ENV})
    assert put.status_code == 200 and put.json() == {"ok": True, "names": sorted(ENV), "digest": envvars.digest(ENV)}
    assert "staging" not in put.text  # the answer names variables, never their values
    assert dict(desktop.session_env.by_name) == ENV
    held = client.get("/v1/env", headers=auth.sign(SECRET).headers)
    assert held.json()["digest"] == envvars.digest(ENV) and "staging" not in held.text
    refused = _put_env(client, {"env": {"PATH": "/tmp/evil"}})
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "env.PATH"
    assert dict(desktop.session_env.by_name) == ENV  # a bad body changes nothing
    assert client.get("/v1/env").status_code == 401  # no one but the gateway
    assert client.put("/v1/env", content=json.dumps({"env": {}}), headers=JSON).status_code == 401


def test_the_session_env_sits_under_what_corral_sets_and_the_placeholders() -> None:
    placeholder = new_placeholder()
    env = agentenv.command_environment(
        "corral-proxy:8080", "/ca.pem", "a1.x", {"GITHUB_TOKEN": placeholder}, {"APP_MODE": "staging"}
    )
    assert env["APP_MODE"] == "staging" and env["GITHUB_TOKEN"] == placeholder
    assert env["PATH"] == agentenv.PATH and env["HTTPS_PROXY"].endswith("@corral-proxy:8080")


async def test_every_exec_gets_the_session_env_of_the_moment_it_starts_and_its_own_env_wins() -> None:
    held = SessionEnv(ENV)
    launcher = FakeLauncher(prints(b""))
    settings = ProcessSettings(proxy="corral-proxy:8080")
    processes = ProcessTable(launcher, settings, Placeholders(), held)  # type: ignore[arg-type]
    await ran(processes, exec_action(env={"greeting": "mine"}), RunContext("a1.x"))
    env = launcher.spawned[0]["env"]
    assert env["APP_MODE"] == "staging" and env["greeting"] == "mine"  # the request's own env has the last word
    held.replace({"APP_MODE": "prod"})
    await ran(processes, exec_action(pty=a.PtySize()), RunContext("a2.x"))
    env = launcher.spawned[1]["env"]
    assert env["APP_MODE"] == "prod" and "greeting" not in env and env["TERM"] == "xterm-256color"
    assert processes.command_environment("a3.x")["APP_MODE"] == "prod"  # the persistent shell's exports too
