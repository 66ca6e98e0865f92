"""The sandbox's first process, as root: lock egress down, then become ``corral`` with no
capabilities at all and exec tini, which runs :mod:`corral.sandbox.init`.

With a proxy (``CORRAL_PROXY``), the firewall allows out only loopback and TCP to the proxy's
ports on the session network, and in only the gateway's connections to the controller; the bridge's
host address is refused outright (Docker lets an ``--internal`` network reach the host through it).
It is set before anything the agent can touch starts, and nothing in the sandbox can change it
afterwards: NET_ADMIN is gone from every process, bounding set included.

Root also writes what the sandbox must trust and may not change: Chromium's managed policy (the
proxy, QUIC off, WebRTC only through the proxy, DNS-over-HTTPS off) and the system CA bundle with
the session's CA certificate (the key never comes here).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("corral.boot")

USER = "corral"
RUN_DIR = Path("/run/corral")
CHROMIUM_POLICY = RUN_DIR / "chromium-policy.json"
CA_CERT = RUN_DIR / "session-ca.pem"
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PRISTINE_BUNDLE = Path("/usr/share/corral/ca-certificates.crt")  # Debian's, copied at image build
CONTROLLER_PORT = 8765


def proxy_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"CORRAL_PROXY must look like host:port, not {value!r}")
    return host, int(port)


def firewall_rules(network: str, gateway: str, proxy_ports: list[int]) -> str:
    """An ``iptables-restore`` ruleset for the filter table (IPv4)."""
    net = ipaddress.ip_network(network, strict=False)
    host = ipaddress.ip_address(gateway)
    if host not in net:
        raise ValueError(f"gateway {gateway} is not inside the session network {network}")
    ports = ",".join(str(port) for port in proxy_ports)
    return "\n".join(
        [
            "*filter",
            ":INPUT DROP [0:0]",
            ":FORWARD DROP [0:0]",
            ":OUTPUT DROP [0:0]",
            "-A INPUT -i lo -j ACCEPT",
            "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            f"-A INPUT -p tcp -s {host}/32 --dport {CONTROLLER_PORT} -j ACCEPT",
            "-A OUTPUT -o lo -j ACCEPT",
            "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            f"-A OUTPUT -d {host}/32 -j REJECT --reject-with icmp-admin-prohibited",
            f"-A OUTPUT -p tcp -d {net} -m multiport --dports {ports} -j ACCEPT",
            # REJECT, not DROP: a bypass attempt fails at once instead of hanging the agent.
            "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
            "-A OUTPUT -j REJECT --reject-with icmp-admin-prohibited",
            "COMMIT",
            "",
        ]
    )


IPV6_RULES = (
    "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT DROP [0:0]\n"
    "-A INPUT -i lo -j ACCEPT\n-A OUTPUT -o lo -j ACCEPT\nCOMMIT\n"
)


def chromium_policy(proxy: str | None) -> dict[str, object]:
    policy: dict[str, object] = {
        "QuicAllowed": False,
        "DnsOverHttpsMode": "off",
        "BuiltInDnsClientEnabled": False,
        "WebRtcIPHandling": "disable_non_proxied_udp",
        "BackgroundModeEnabled": False,
    }
    if proxy:
        policy["ProxySettings"] = {"ProxyMode": "fixed_servers", "ProxyServer": f"http://{proxy}"}
    return policy


def _apply(command: str, rules: str) -> None:
    binary = shutil.which(command)
    if binary is None:
        raise RuntimeError(f"{command} is missing from the image")
    done = subprocess.run([binary], input=rules.encode(), capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed: {done.stderr.decode(errors='replace').strip()}")


def lock_down(env: Mapping[str, str]) -> None:
    """Firewall and trust, as root; raises (and the sandbox does not start) if any of it fails."""
    proxy = env.get("CORRAL_PROXY", "")
    RUN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    if proxy:
        _, port = proxy_address(proxy)
        control_port = int(env.get("CORRAL_PROXY_CONTROL_PORT", "8081"))
        network, gateway = env.get("CORRAL_SESSION_NET", ""), env.get("CORRAL_SESSION_GATEWAY", "")
        if not network or not gateway:
            raise RuntimeError("CORRAL_PROXY needs CORRAL_SESSION_NET and CORRAL_SESSION_GATEWAY")
        _apply("iptables-restore", firewall_rules(network, gateway, [port, control_port]))
        try:
            _apply("ip6tables-restore", IPV6_RULES)
        except RuntimeError as exc:
            # No IPv6 in this network namespace means no IPv6 route either.
            if Path("/proc/net/if_inet6").exists() and Path("/proc/net/if_inet6").read_text().strip():
                raise
            log.info("no IPv6 here (%s)", exc)
        log.info("egress locked to the proxy at %s (session network %s)", proxy, network)
    CHROMIUM_POLICY.write_text(json.dumps(chromium_policy(proxy or None)))
    ca = env.get("CORRAL_CA_CERT", "")
    if ca:
        if "BEGIN CERTIFICATE" not in ca or "PRIVATE KEY" in ca:
            raise RuntimeError("CORRAL_CA_CERT must hold one PEM certificate and nothing else")
        CA_CERT.write_text(ca.strip() + "\n")
        if PRISTINE_BUNDLE.exists() and SYSTEM_BUNDLE.parent.is_dir() and os.access(SYSTEM_BUNDLE.parent, os.W_OK):
            SYSTEM_BUNDLE.write_text(PRISTINE_BUNDLE.read_text() + "\n" + ca.strip() + "\n")
    elif PRISTINE_BUNDLE.exists() and os.access(SYSTEM_BUNDLE.parent, os.W_OK) and not SYSTEM_BUNDLE.exists():
        shutil.copyfile(PRISTINE_BUNDLE, SYSTEM_BUNDLE)


def drop_argv(target: list[str]) -> list[str]:
    """setpriv: become corral, no supplementary groups, empty bounding/inheritable/ambient sets."""
    return [
        "setpriv",
        f"--reuid={USER}",
        f"--regid={USER}",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        *target,
    ]


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    target = ["/usr/bin/tini", "--", sys.executable, "-m", "corral.sandbox.init"]
    if os.getuid() != 0:
        if os.environ.get("CORRAL_PROXY"):
            log.error("CORRAL_PROXY is set but the sandbox did not start as root: cannot lock egress down")
            return 3
        os.execv(target[0], target)
    try:
        lock_down(os.environ)
    except (RuntimeError, ValueError, OSError) as exc:
        log.error("cannot lock the sandbox down, refusing to start: %s", exc)
        return 3
    home = pwd.getpwnam(USER).pw_dir
    os.environ.update({"HOME": home, "USER": USER, "LOGNAME": USER})
    argv = drop_argv(target)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main())
