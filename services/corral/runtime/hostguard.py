"""Host-side firewall for the sandbox bridge: sandboxes get no way into the host's own services.

Docker lets a container reach every host service listening on the bridge's gateway address (or on
0.0.0.0) through the INPUT chain. Two rules on the bridge interface close that, on any engine
version: replies to connections the host opened (the gateway talking to a controller) pass, all
else from the sandboxes to the host is dropped. Needs root (or NET_ADMIN) and iptables.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

COMMENT = "corral-hostguard"


def _rules(interface: str) -> list[list[str]]:
    # Order matters: the ACCEPT for replies must come before the DROP.
    return [
        [
            "INPUT",
            "-i",
            interface,
            "-m",
            "conntrack",
            "--ctstate",
            "ESTABLISHED,RELATED",
            "-m",
            "comment",
            "--comment",
            COMMENT,
            "-j",
            "ACCEPT",
        ],
        ["INPUT", "-i", interface, "-m", "comment", "--comment", COMMENT, "-j", "DROP"],
    ]


def remove(interface: str) -> None:
    """Take ``interface``'s rules out again (its network is gone); quietly does nothing without them."""
    iptables = shutil.which("iptables")
    if iptables is None:
        return
    for rule in _rules(interface):
        while subprocess.run([iptables, "-w", "-D", *rule], capture_output=True, check=False).returncode == 0:
            pass


def install(interface: str) -> bool:
    """Install the rules for ``interface`` once (idempotent); False when the host does not allow it."""
    iptables = shutil.which("iptables")
    if iptables is None:
        log.error("iptables is missing: sandboxes can reach services on the host")
        return False
    installed = True
    # Inserted at the top in reverse, so they end up in the order of _rules.
    for rule in reversed(_rules(interface)):
        check = subprocess.run([iptables, "-w", "-C", *rule], capture_output=True, check=False)
        if check.returncode == 0:
            continue
        chain, *spec = rule
        done = subprocess.run([iptables, "-w", "-I", chain, "1", *spec], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log.error(
                "cannot install the host guard (%s): sandboxes can reach services on the host", done.stderr.strip()
            )
            installed = False
    return installed


def guarded_interfaces() -> set[str]:
    """The interfaces that have host-guard rules now (any gateway's), read from the INPUT chain."""
    iptables = shutil.which("iptables")
    if iptables is None:
        return set()
    listed = subprocess.run([iptables, "-w", "-S", "INPUT"], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        return set()
    return _interfaces(listed.stdout)


def _interfaces(rules: str) -> set[str]:
    found = set()
    for line in rules.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        options = dict(zip(words, [*words[1:], ""], strict=True))
        if options.get("--comment") == COMMENT and options.get("-i"):
            found.add(options["-i"])
    return found


def _interface_exists(name: str) -> bool:
    return (Path("/sys/class/net") / name).exists()


def remove_stale(exists: Callable[[str], bool] = _interface_exists) -> list[str]:
    """Remove the rules of interfaces that no longer exist (their network went while no gateway
    watched: a crash, a kill); returns those interfaces. Rules of live bridges stay, whoever made them."""
    stale = sorted(name for name in guarded_interfaces() if not exists(name))
    for name in stale:
        log.info("removing the host guard of %s: that interface is gone", name)
        remove(name)
    return stale


def local_addresses(fib_trie: Path = Path("/proc/net/fib_trie"), inet6: Path = Path("/proc/net/if_inet6")) -> list[str]:
    """This host's own addresses (every interface's, the bridges' among them), read from the kernel:
    what a session's proxy must never dial, whatever networks the operator trusts. Empty where the
    kernel does not say (not Linux)."""
    found: dict[str, None] = {}
    with contextlib.suppress(OSError):
        previous = ""
        for line in fib_trie.read_text().splitlines():
            if line.strip() == "/32 host LOCAL" and previous:
                found[previous] = None
            words = line.split()
            previous = words[-1] if len(words) == 2 and words[0] in ("|--", "+--") else previous
    with contextlib.suppress(OSError):
        for line in inet6.read_text().splitlines():
            raw = line.split()[0] if line.split() else ""
            with contextlib.suppress(ValueError):
                found[str(ipaddress.IPv6Address(bytes.fromhex(raw)))] = None
    return list(found)
