"""The environment of the agent's commands (a minimal version: the egress helper's replaces it)."""

from __future__ import annotations

AGENT_HOME = "/home/agent"
PATH = f"{AGENT_HOME}/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
)


def command_environment(proxy: str, ca_bundle: str | None, action_id: str) -> dict[str, str]:
    """What every command the agent runs starts with; ``proxy`` is the session's (host:port) or empty."""
    env = {
        "HOME": AGENT_HOME,
        "USER": "agent",
        "LOGNAME": "agent",
        "SHELL": "/bin/bash",
        "PATH": PATH,
        "LANG": "C.UTF-8",
        "DISPLAY": ":0",
    }
    if proxy:
        url = f"http://corral-action:{action_id}@{proxy}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
            env[name] = url
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    if ca_bundle:
        env.update(dict.fromkeys(CA_VARIABLES, ca_bundle))
    return env
