"""The host guard of one Swarm node: what runs in each task of the global service `corral-hostguard`.

On a single host, `hostguard` closes the sandbox bridge's way into the host (INPUT). On a swarm,
sandboxes sit on internal overlays (no route off them at all), but every task on a non-internal
overlay, the proxies on the egress overlay among them, gets a second interface on the node's
`docker_gwbridge`, routed by the node. Through it a proxy reaches the node itself (INPUT) and every
other node and the registry (FORWARD): the swarm's control port 2377, its gossip 7946, VXLAN 4789
(a forged VXLAN frame lands on any overlay, a session's internal one included), a Docker API on TCP,
the registry's push. The guard drops both, in the node's own network namespace, whatever the
session's allowlist says:

- INPUT from the bridge: `hostguard`'s two rules (replies to what the node opened pass);
- FORWARD from the bridge (in DOCKER-USER, the chain Docker leaves to operators) to each blocked
  network: the node's own addresses (read from its kernel), every node's and manager's address and
  the registry's (given by the runtime, names resolved on every pass), any network the operator adds.

It syncs every few seconds: missing rules go in, rules of ours for a network no longer blocked go
out (a node that left), so an updated service converges without a gap. It never removes its rules
when it stops (a guard restarting or updated must not open a window); `--remove` takes them out.
Needs the host's network namespace, NET_ADMIN and NET_RAW, and iptables; no Docker.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.runtime import hostguard

log = logging.getLogger(__name__)

COMMENT = "corral-nodeguard"
BRIDGE = "docker_gwbridge"
OPERATOR_CHAIN = "DOCKER-USER"
EVERY_S = 5.0
# What one pass may hold: a swarm's nodes, managers and registry, with room to spare. A longer
# list is a mistake in the service's arguments, refused rather than turned into thousands of rules.
MAX_BLOCKED = 1024

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Run = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class Rule:
    """One FORWARD drop of ours: traffic in from ``interface`` to ``network`` that is not a reply."""

    interface: str
    network: Network


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def rule_spec(rule: Rule) -> list[str]:
    """The match and target of ``rule``, without chain or command (the same for -C, -I and -D)."""
    return [
        "-i",
        rule.interface,
        "-d",
        str(rule.network),
        "-m",
        "conntrack",
        "!",
        "--ctstate",
        "ESTABLISHED,RELATED",
        "-m",
        "comment",
        "--comment",
        COMMENT,
        "-j",
        "DROP",
    ]


def parse_rules(listing: str) -> set[Rule]:
    """Our rules in an `iptables -S CHAIN` listing (anyone else's are left alone)."""
    found: set[Rule] = set()
    for line in listing.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        options = dict(zip(words, [*words[1:], ""], strict=True))
        if options.get("--comment") != COMMENT or not options.get("-i") or not options.get("-d"):
            continue
        with contextlib.suppress(ValueError):
            found.add(Rule(options["-i"], ipaddress.ip_network(options["-d"], strict=False)))
    return found


def blocked_networks(given: Iterable[str], local: Iterable[str], resolve: Callable[[str], list[str]]) -> set[Network]:
    """Every network to drop: each given address, network or host name (resolved now: a registry's
    address may change) and each of the node's own addresses. Loopback is left out: it never arrives
    on the bridge, and an iptables rule cannot name it there anyway."""
    networks: set[Network] = set()
    for item in [*given, *local]:
        item = item.strip()
        if not item:
            continue
        try:
            networks.add(ipaddress.ip_network(item, strict=False))
        except ValueError:
            networks.update(ipaddress.ip_network(address) for address in resolve(item))
    return {network for network in networks if not network.is_loopback and not network.is_link_local}


def resolve_host(name: str) -> list[str]:
    """The addresses ``name`` has now; none when it does not resolve (logged: a blocked host that
    cannot be found cannot be reached through its name either, and its address may be given too)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        log.warning("cannot resolve %s (%s): not blocked by name this pass", name, exc)
        return []
    return sorted({str(info[4][0]) for info in infos})


def plan(existing: set[Rule], wanted: set[Rule]) -> tuple[list[Rule], list[Rule]]:
    """(to remove, to add), each in a stable order."""
    key: Callable[[Rule], tuple[str, int, str]] = lambda rule: (rule.interface, rule.network.version, str(rule.network))  # noqa: E731
    return sorted(existing - wanted, key=key), sorted(wanted - existing, key=key)


class Guard:
    """Keeps one node's rules as wanted; every iptables call goes through ``run``."""

    def __init__(self, interface: str, run: Run = _run) -> None:
        self.interface = interface
        self.run = run

    def _tool(self, version: int) -> str | None:
        return shutil.which("iptables" if version == 4 else "ip6tables")

    def _chain(self, tool: str) -> str:
        # DOCKER-USER is where Docker wants operators' FORWARD rules and never flushes; FORWARD
        # itself on a node whose engine runs without iptables.
        has_chain = self.run([tool, "-w", "-S", OPERATOR_CHAIN]).returncode == 0
        return OPERATOR_CHAIN if has_chain else "FORWARD"

    def sync(self, networks: set[Network]) -> bool:
        """One pass: the INPUT guard, then the FORWARD drops made exactly ``networks``. True when
        every rule is in place."""
        complete = hostguard.install(self.interface)
        for version in (4, 6):
            tool = self._tool(version)
            mine = {network for network in networks if network.version == version}
            if tool is None:
                if mine:
                    log.error("no ip%stables: %d networks not blocked", "6" if version == 6 else "", len(mine))
                    complete = False
                continue
            complete = self._sync_forward(tool, {Rule(self.interface, network) for network in mine}) and complete
        return complete

    def _sync_forward(self, tool: str, wanted: set[Rule]) -> bool:
        chain = self._chain(tool)
        listing = self.run([tool, "-w", "-S", chain])
        if listing.returncode != 0:
            log.error("cannot list %s (%s)", chain, listing.stderr.strip())
            return False
        # Ours for this interface only: a guard for another bridge keeps its own.
        existing = {rule for rule in parse_rules(listing.stdout) if rule.interface == self.interface}
        stale, missing = plan(existing, wanted)
        for rule in stale:
            log.info("no longer blocking %s", rule.network)
            self.run([tool, "-w", "-D", chain, *rule_spec(rule)])
        complete = True
        for rule in missing:
            done = self.run([tool, "-w", "-I", chain, "1", *rule_spec(rule)])
            if done.returncode != 0:
                log.error("cannot block %s (%s)", rule.network, done.stderr.strip())
                complete = False
            else:
                log.info("blocking %s from %s", rule.network, self.interface)
        return complete

    def remove(self) -> None:
        """Every rule of ours for this interface, INPUT and FORWARD, out (the operator's choice)."""
        hostguard.remove(self.interface)
        for version in (4, 6):
            tool = self._tool(version)
            if tool is not None:
                self._sync_forward(tool, set())


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m corral.runtime.nodeguard", description=__doc__.splitlines()[0])
    parser.add_argument("--block", default="", help="comma-separated addresses, networks or host names to drop")
    parser.add_argument("--interface", default=BRIDGE, help="the bridge the tasks' traffic comes in on")
    parser.add_argument("--every", type=float, default=EVERY_S, help="seconds between passes")
    parser.add_argument("--once", action="store_true", help="one pass, then exit (1 when incomplete)")
    parser.add_argument("--remove", action="store_true", help="take this guard's rules out and exit")
    parser.add_argument("--ready-file", default="", help="a file present exactly while the last pass was complete")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s nodeguard %(levelname)s %(message)s")
    args = _arguments(sys.argv[1:] if argv is None else argv)
    given = [item for item in args.block.split(",") if item.strip()]
    if len(given) > MAX_BLOCKED:
        log.error("%d networks to block: at most %d", len(given), MAX_BLOCKED)
        return 2
    # PID 1 of its container: without a handler SIGTERM is ignored and every stop waits for the
    # SIGKILL. It exits at once and leaves its rules (the module's docstring says why).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    guard = Guard(args.interface)
    if args.remove:
        guard.remove()
        return 0
    ready = Path(args.ready_file) if args.ready_file else None
    while True:
        complete = guard.sync(blocked_networks(given, hostguard.local_addresses(), resolve_host))
        if ready is not None:
            # The service's health check: Swarm reports the task running only once it is healthy,
            # so a node counts as guarded after its first complete pass, not when the process starts.
            mark_ready(ready, complete)
        if args.once:
            return 0 if complete else 1
        time.sleep(args.every)


def mark_ready(path: Path, complete: bool) -> None:
    if complete:
        path.touch()
    else:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
