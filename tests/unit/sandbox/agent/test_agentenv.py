"""The command environment: the agent's identity and PATH, and the session's proxy and CA under
every name the common tools read."""

from __future__ import annotations

import base64
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from corral.proxy.control import ACTION_ID
from corral.sandbox.agent import agentenv
from corral.sandbox.agent.agentenv import CA_VARIABLES, PROXY_VARIABLES, command_environment

BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def test_the_agent_is_who_the_command_runs_as_with_its_own_programs_first() -> None:
    env = command_environment(None, None, "a1.x")
    assert (env["HOME"], env["USER"], env["LOGNAME"], env["SHELL"]) == ("/home/agent", "agent", "agent", "/bin/bash")
    assert env["PATH"].split(":") == ["/home/agent/.local/bin", "/usr/local/bin", "/usr/bin", "/bin"]
    assert env["LANG"] == "C.UTF-8" and env["DISPLAY"] == ":0"
    assert env["XAUTHORITY"] == "/run/corral/x11/agent"  # the untrusted cookie, never the controller's
    # npm's global installs land where pip's user installs do: ~/.local/bin, first on PATH.
    assert env["NPM_CONFIG_PREFIX"] == "/home/agent/.local"
    # The controller's own venv and secrets are no part of it; TERM is the caller's (pty or not).
    assert "/opt/corral" not in env["PATH"] and "TERM" not in env
    assert not any(name.startswith("CORRAL_") for name in env)


def test_without_egress_control_no_proxy_and_no_ca_variables() -> None:
    env = command_environment("", None, "a1.x")
    assert not set(PROXY_VARIABLES) & set(env) and "NO_PROXY" not in env and "no_proxy" not in env
    assert "GIT_HTTP_PROXY_AUTHMETHOD" not in env
    assert not set(CA_VARIABLES) & set(env)


def test_every_proxy_variable_names_the_proxy_with_the_action_as_its_credentials() -> None:
    env = command_environment("corral-proxy:8080", BUNDLE, "a17.b00t")
    url = "http://corral-action:a17.b00t@corral-proxy:8080"
    assert {name: env[name] for name in PROXY_VARIABLES} == dict.fromkeys(PROXY_VARIABLES, url)
    assert {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"} <= set(PROXY_VARIABLES)
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    # git sends proxy credentials only when asked (a 407) unless told to send them up front.
    assert env["GIT_HTTP_PROXY_AUTHMETHOD"] == "basic"


def test_every_ca_variable_names_the_bundle() -> None:
    env = command_environment("corral-proxy:8080", BUNDLE, "a1.x")
    expected = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "GIT_SSL_CAINFO")
    assert set(expected) | {"CURL_CA_BUNDLE"} == set(CA_VARIABLES)
    assert {name: env[name] for name in CA_VARIABLES} == dict.fromkeys(CA_VARIABLES, BUNDLE)


@pytest.mark.parametrize("action_id", ["a1.x", "a12.3f9c", "act:with:colons", "x" * 64, "odd id/é@%"])
def test_a_client_sends_the_action_id_back_as_the_proxy_password(action_id: str) -> None:
    # What clients do with the URL's user info (urllib here; curl, requests, git and npm alike):
    # decode it and send it as Basic credentials, which the proxy reads back as the action id.
    url = command_environment("corral-proxy:8080", None, action_id)["HTTPS_PROXY"]
    parts = urllib.parse.urlsplit(url)
    assert (parts.hostname, parts.port) == ("corral-proxy", 8080)
    handler = urllib.request.ProxyHandler({"https": url})
    request = urllib.request.Request("https://example.test/")
    handler.proxy_open(request, url, "https")
    credentials = request.headers.get("Proxy-authorization") or request.unredirected_hdrs["Proxy-authorization"]
    scheme, _, token = credentials.partition(" ")
    assert scheme == "Basic"
    assert base64.b64decode(token).decode() == f"corral-action:{action_id}"


def test_the_controllers_action_ids_need_no_escaping() -> None:
    action_id = "a3.0f1e2d3c"
    assert ACTION_ID.fullmatch(action_id)
    assert agentenv.proxy_url("corral-proxy:8080", action_id).endswith(f":{action_id}@corral-proxy:8080")


@pytest.mark.parametrize("proxy", ["corral-proxy", ":8080", "corral-proxy:port"])
def test_a_proxy_that_is_not_host_and_port_is_refused(proxy: str) -> None:
    with pytest.raises(ValueError):
        command_environment(proxy, None, "a1.x")


def test_each_call_is_a_new_dict() -> None:
    first = command_environment("corral-proxy:8080", BUNDLE, "a1.x")
    first["PATH"] = "/tmp"
    assert command_environment("corral-proxy:8080", BUNDLE, "a1.x")["PATH"] != "/tmp"
    assert command_environment("corral-proxy:8080", BUNDLE, "a2.x")["HTTP_PROXY"].endswith(":a2.x@corral-proxy:8080")


def test_the_sessions_placeholders_come_after_the_proxy_and_ca_variables() -> None:
    placeholders = {"GITHUB_TOKEN": "corral_secret_" + "0" * 32, "DB_PASSWORD": "corral_secret_" + "f" * 32}
    env = command_environment("corral-proxy:8080", BUNDLE, "a1.x", placeholders)
    assert {name: env[name] for name in placeholders} == placeholders
    without = command_environment("corral-proxy:8080", BUNDLE, "a1.x")
    # Added last, and nothing else changed: the base, proxy and CA variables are all still there.
    assert list(env) == [*without, *placeholders]
    assert {name: env[name] for name in without} == without


def test_without_placeholders_no_secret_variable() -> None:
    env = command_environment("corral-proxy:8080", BUNDLE, "a1.x", {})
    assert not any(value.startswith("corral_secret_") for value in env.values())


def test_a_templates_environment_goes_over_the_base_and_under_the_sessions(tmp_path: Path) -> None:
    path = tmp_path / "template-env.json"
    path.write_text('{"PATH": "/opt/tool/bin:/usr/bin", "GREETING": "hi", "HTTP_PROXY": "http://elsewhere"}')
    template = agentenv.template_environment(path)
    session = {"GREETING": "hello", "MODE": "test"}
    env = command_environment("corral-proxy:8080", None, "act_1", {"TOKEN": "corral_secret_x"}, session, template)
    assert env["PATH"] == "/opt/tool/bin:/usr/bin" and env["GREETING"] == "hello"  # create's env over the template's
    assert env["MODE"] == "test"
    assert env["HTTP_PROXY"].startswith("http://corral-action:")  # the session's own wins
    assert env["TOKEN"] == "corral_secret_x"


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[1, 2]", b'{"A": 1}', b'{"bad name": "x"}', b'{"A": "' + b"x" * (64 << 10) + b'"}'],
)
def test_a_template_environment_that_is_not_one_gives_nothing_of_itself(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "template-env.json"
    path.write_bytes(content)
    assert agentenv.template_environment(path) == {}
    assert agentenv.template_environment(tmp_path / "absent.json") == {}  # the base image has none
