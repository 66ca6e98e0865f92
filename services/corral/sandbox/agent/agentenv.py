"""The environment a command runs in, as the agent: who it is, where its programs are, and how it
reaches the network.

With egress control every command is told the session's proxy (``HTTP_PROXY`` and its spellings)
with the ``exec``'s action id as the proxy credentials (user ``corral-action``, the id as password),
so the proxy names the action that caused each request even while other actions run, and a
background process's requests keep naming the action that started it. And it is told the bundle
that trusts the session's CA (the system CAs plus the session's, written by
:mod:`corral.sandbox.startup.boot`) under each name a common tool reads: OpenSSL and Python
(``SSL_CERT_FILE``), requests (``REQUESTS_CA_BUNDLE``), Node.js and npm (``NODE_EXTRA_CA_CERTS``),
pip (``PIP_CERT``), git (``GIT_SSL_CAINFO``), curl (``CURL_CA_BUNDLE``). docs/image.md has the
whole list and why each is there. And it holds the session's secret placeholders, each under its
secret's name (:mod:`corral.sandbox.placeholders`): what the agent's tools send where the value goes.

Pure: the controller's settings say where the proxy and the bundle are (``CORRAL_PROXY``, and
the bundle boot writes when the session has one); the process table asks for an environment per
``exec`` (:func:`command_environment`, with the placeholders of the moment), then adds ``TERM`` and
the request's own ``env``.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from corral.contracts.control import PROXY_USER
from corral.sandbox.display import xaccess
from corral.sandbox.startup import boot

AGENT_USER = boot.AGENT_USER
AGENT_HOME = "/home/agent"
# ~/.local/bin first: `pip install` (a user install, as the agent) and `npm install -g`
# (NPM_CONFIG_PREFIX below) put programs there. The login shell's profile says the same
# (images/desktop/profile.sh); this is what an `argv` exec, which no shell starts, gets.
PATH = f"{AGENT_HOME}/.local/bin:/usr/local/bin:/usr/bin:/bin"
DISPLAY = ":0"  # the session's screen: X clients the agent runs show up in its screenshots
CA_BUNDLE = str(boot.SYSTEM_BUNDLE)  # the system CAs and the session's, readable by every uid
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
NO_PROXY = "localhost,127.0.0.1,::1"
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
)
BASE = {
    "HOME": AGENT_HOME,
    "USER": AGENT_USER,
    "LOGNAME": AGENT_USER,
    "SHELL": "/bin/bash",
    "PATH": PATH,
    "LANG": "C.UTF-8",
    "DISPLAY": DISPLAY,
    # The untrusted cookie: windows, but no XTEST, no RECORD, no other client's pixels (xaccess).
    "XAUTHORITY": str(xaccess.AGENT_XAUTH),
    # No pager (none is installed, and a command's output is read, not paged).
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    # A command's output streams as it is printed, not when Python's pipe buffer fills.
    "PYTHONUNBUFFERED": "1",
    # `npm install -g` as the agent: into ~/.local (the root is read-only and not the agent's).
    "NPM_CONFIG_PREFIX": f"{AGENT_HOME}/.local",
    # Neither asks a registry about its own new versions: requests nobody asked for, refused by
    # most allowlists, each an audit record.
    "NPM_CONFIG_UPDATE_NOTIFIER": "false",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    # Matplotlib draws to files, never to a window (a run_code kernel uses its inline backend instead).
    "MPLBACKEND": "Agg",
}


# A template's environment (corral.gateway.templates), written into its image at build: under the
# session's own variables (proxy, CA bundle, placeholders) and an exec's ``env``, over BASE.
TEMPLATE_ENV_FILE = Path("/usr/share/corral/template-env.json")
TEMPLATE_ENV_MAX_BYTES = 64 << 10
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def template_environment(path: Path = TEMPLATE_ENV_FILE) -> dict[str, str]:
    """The template's variables (none for the base image, which has no file). Read bounded; a file
    that is not a JSON object of names to strings gives none (the template's build wrote it, so
    this never happens short of a hand-made image)."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(TEMPLATE_ENV_MAX_BYTES + 1)
    except OSError:
        return {}
    try:
        data = json.loads(raw) if len(raw) <= TEMPLATE_ENV_MAX_BYTES else None
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        name: value
        for name, value in data.items()
        if isinstance(value, str) and _ENV_NAME.fullmatch(name) and "\0" not in value
    }


def proxy_url(proxy: str, action_id: str) -> str:
    """The proxy's URL with the action id as its password, percent-encoded: every client decodes
    user info before it sends ``Proxy-Authorization: Basic base64("corral-action:<id>")``."""
    boot.proxy_address(proxy)  # host:port, or ValueError
    return f"http://{PROXY_USER}:{urllib.parse.quote(action_id, safe='')}@{proxy}"


def command_environment(
    proxy: str | None,
    ca_bundle: str | None,
    action_id: str,
    placeholders: Mapping[str, str] | None = None,
    session_env: Mapping[str, str] | None = None,
    template: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a command the ``exec`` action ``action_id`` starts.

    ``proxy`` is the session proxy's ``host:port`` (None or empty: no egress control, no proxy
    variables); ``ca_bundle`` the file that trusts the session's CA (None: the tools' defaults);
    ``placeholders`` the session's secrets, name to placeholder (their names are never one of the
    variables above: ``corral.contracts.placeholders.name_problem`` reserves those); ``session_env``
    the session's own variables (``env`` at create, :mod:`corral.sandbox.sessionenv`: never one of the
    variables above either, ``corral.contracts.envvars``), put before the placeholders, which win.
    ``template`` is the template's environment (:func:`template_environment`): over BASE, under
    the session's own variables.
    Raises ValueError for a proxy that is not ``host:port``."""
    env = dict(BASE)
    env.update(template or {})
    if proxy:
        url = proxy_url(proxy, action_id)
        env.update(dict.fromkeys(PROXY_VARIABLES, url))
        env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
        # git's default ("anyauth") sends credentials only when a proxy asks for them (407), which
        # this one never does: with "basic" it names the action on every CONNECT, as curl does.
        env["GIT_HTTP_PROXY_AUTHMETHOD"] = "basic"
    if ca_bundle:
        env.update(dict.fromkeys(CA_VARIABLES, ca_bundle))
    if session_env:
        env.update(session_env)
    if placeholders:
        env.update(placeholders)
    return env
