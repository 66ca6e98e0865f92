"""The sidecar's entry point: find this container's address on the session network, then exec
mitmproxy with Corral's addons (corral.proxy.leanmaster: mitmdump's chain without the addons Corral
does not use), listening (proxy and control channel) on that address only.

Settings come from the environment the gateway sets (``CORRAL_*``); the CA the gateway made for
the session is read from ``$CORRAL_STATE_DIR/ca`` (mitmproxy's confdir).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from corral.errors import SeedRefused
from corral.proxy.control import CONTROL_PORT
from corral.proxy.hosts import own_addresses
from corral.proxy.seed import SEED_DIR_VARIABLE, plant

log = logging.getLogger("corral.proxy.sidecar")

PROXY_PORT = 8080
PROXY_ALIAS = "corral-proxy"  # the proxy's name on every session network
TOKENS_FILE = Path("/tmp/corral-tokens.json")  # the proxy container's own tmpfs, 0600
TOKEN_VARIABLES = ("CORRAL_GATEWAY_TOKEN", "CORRAL_CONTROLLER_TOKEN")
DEFAULT_STATE_DIR = "/var/lib/corral-egress"


def write_tokens(env: Mapping[str, str], path: Path = TOKENS_FILE) -> dict[str, str]:
    """The control channel's tokens into a 0600 file for the addon; returns the environment left for
    mitmdump, without them (a command line, and another uid's view of it, would show them)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"gateway": env.get(TOKEN_VARIABLES[0], ""), "controller": env.get(TOKEN_VARIABLES[1], "")}, out)
    return {k: v for k, v in env.items() if k not in TOKEN_VARIABLES}


def plant_seed(env: Mapping[str, str]) -> list[str]:
    """The state the runtime seeded (``CORRAL_SEED_DIR``: a runtime that shares no directory with the
    gateway) planted into the proxy's own state directory, when that is empty: a proxy whose state
    is there already (the gateway's own, bind-mounted) starts from it as it is."""
    seed = env.get(SEED_DIR_VARIABLE, "")
    state = Path(env.get("CORRAL_STATE_DIR", DEFAULT_STATE_DIR))
    if not seed or (state.is_dir() and any(state.iterdir())):
        return []
    return plant(Path(seed), state)


def address_in(network: str, timeout_s: float = 10.0) -> str:
    """This container's address inside ``network`` (waits briefly: interfaces can come up late)."""
    net = ipaddress.ip_network(network, strict=False)
    deadline = time.monotonic() + timeout_s
    while True:
        for address in own_addresses():
            if ipaddress.ip_address(address) in net:
                return address
        if time.monotonic() > deadline:
            raise RuntimeError(f"no address of this container lies in the session network {network}")
        time.sleep(0.05)


def proxy_argv(env: Mapping[str, str], listen: str) -> list[str]:
    """corral.proxy.leanmaster's command line: every setting a ``--set`` option, as mitmdump takes them."""
    state = Path(env.get("CORRAL_STATE_DIR", DEFAULT_STATE_DIR))
    options = {
        "listen_host": listen,
        "listen_port": env.get("CORRAL_PROXY_PORT", str(PROXY_PORT)),
        "confdir": str(state / "ca"),
        "connection_strategy": "eager",
        "http3": "false",  # no QUIC from the proxy either
        "rawtcp": "false",  # inside a tunnel everything is parsed as HTTP, so every request meets the checks
        "termlog_verbosity": "warn",
        "corral_session": env.get("CORRAL_SESSION", ""),
        "corral_state_dir": str(state),
        "corral_mode": env.get("CORRAL_EGRESS_MODE", "enforce"),
        "corral_control_host": listen,
        "corral_control_port": env.get("CORRAL_CONTROL_PORT", str(CONTROL_PORT)),
        "corral_tokens_file": str(TOKENS_FILE),
        "corral_trusted_networks": env.get("CORRAL_TRUSTED_NETWORKS", ""),
        "corral_allow_private": "true" if _flag(env, "CORRAL_ALLOW_PRIVATE") else "false",
        "corral_own_hosts": PROXY_ALIAS,
        "corral_host_addresses": env.get("CORRAL_HOST_ADDRESSES", ""),
    }
    if _flag(env, "CORRAL_HERMETIC"):
        # Answers come from the recording: no upstream is dialled, so none is waited for at a CONNECT.
        options.update(connection_strategy="lazy", corral_hermetic="true", corral_keep_responses="false")
    else:
        options["corral_keep_responses"] = "true" if _flag(env, "CORRAL_RECORD_RESPONSES", True) else "false"
    for name, variable in (
        ("corral_responses_max_body", "CORRAL_RESPONSES_MAX_BODY"),
        ("corral_responses_max_total", "CORRAL_RESPONSES_MAX_TOTAL"),
        ("corral_audit_max_bytes", "CORRAL_AUDIT_MAX_BYTES"),
    ):
        if env.get(variable, "").isdigit():
            options[name] = env[variable]
    upstream_ca = state / "upstream-ca.pem"
    if upstream_ca.exists():
        options["ssl_verify_upstream_trusted_ca"] = str(upstream_ca)
    # The image's Python by its path (this one), never by PATH.
    argv = [sys.executable, "-m", "corral.proxy.leanmaster"]
    for name, value in options.items():
        argv += ["--set", f"{name}={value}"]
    return argv


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = env.get(name, "").strip().lower()
    return default if not value else value in ("1", "true", "yes", "on")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    network = os.environ.get("CORRAL_SESSION_NET", "")
    if not network:
        log.error("CORRAL_SESSION_NET is not set: refusing to listen on every interface")
        return 2
    try:
        planted = plant_seed(os.environ)
    except SeedRefused as exc:
        log.error("cannot start from the seeded state: %s", exc)
        return 2
    if planted:
        log.info("state planted from the seed: %s", ", ".join(planted))
    listen = address_in(network)
    argv = proxy_argv(os.environ, listen)
    env = write_tokens(os.environ)
    log.info("egress proxy for %s on %s", os.environ.get("CORRAL_SESSION", "?"), listen)
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    sys.exit(main())
