"""What the node tests do to the test swarm (scripts/swarm, docs/design/0410) besides asking its
gateway: each node's engine by its own socket, Swarm's availability, a worker's link to the LAN cut
and mended in the swarm's LAN namespace. Every command an argument list; nothing on the host's own
engine or network."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

NODE_DOWN_WITHIN_S = 45.0  # Swarm marks a cut-off node down 12-13 s after its link went (0425); margin
OUT_OF_SEQUENCE_TRIES = 10  # a node update refused as out of sequence is made again on the new version
SWARM_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "swarm"


@dataclass(frozen=True)
class SwarmNodes:
    """The test swarm as scripts/swarm's variables name it: node N is NAME-N on NET.N."""

    name: str = os.environ.get("CORRAL_SWARM_NAME", "corral-swarm")
    directory: Path = Path(os.environ.get("CORRAL_SWARM_DIR", "/var/lib/corral-swarm"))
    veth: str = os.environ.get("CORRAL_SWARM_VETH", "crlsw")

    def host(self, index: int) -> str:
        return f"{self.name}-{index}"

    def workers(self) -> list[str]:
        """The nodes sessions run on: scripts/swarm's gateway places them on the workers only."""
        return [host for host in self.nodes() if host != self.host(1)]

    def index(self, host: str) -> int:
        prefix = f"{self.name}-"
        assert host.startswith(prefix), f"{host} is no node of {self.name}"
        return int(host[len(prefix) :])

    def docker(self, index: int, *argv: str, check: bool = True, merged: bool = False) -> str:
        """The docker CLI on node ``index``'s own engine (1: the manager): its output, with its
        errors interleaved as they came when ``merged`` (unchecked then: they are the output)."""
        sock = self.directory / str(index) / "docker.sock"
        done = subprocess.run(
            ["docker", "-H", f"unix://{sock}", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
        if check and not merged and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def nodes(self) -> dict[str, tuple[str, str]]:
        """Host name -> (state, availability), as the manager sees them."""
        out = self.docker(1, "node", "ls", "--format", "{{json .}}")
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return {r["Hostname"]: (str(r["Status"]).lower(), str(r["Availability"]).lower()) for r in rows}

    def set_availability(self, host: str, availability: str) -> None:
        """The node's availability set. Swarm's updates are versioned: the CLI reads the node's version
        and writes against it, and a change of the manager's own in between (the node's status, after
        a pause or a rejoin) refuses the write with "update out of sequence", to be made again on the
        new version. Seen on the test swarm, the drain right after a worker was paused and resumed."""
        for attempt in range(1, OUT_OF_SEQUENCE_TRIES + 1):
            try:
                self.docker(1, "node", "update", "--availability", availability, host)
                return
            except AssertionError as exc:
                if "update out of sequence" not in str(exc) or attempt == OUT_OF_SEQUENCE_TRIES:
                    raise
            time.sleep(0.2)

    def cut(self, host: str) -> None:
        """The node's link to the LAN down, on the LAN's side: the node runs on, unreachable."""
        self._link(host, "down")

    def mend(self, host: str) -> None:
        self._link(host, "up")

    def _link(self, host: str, how: str) -> None:
        veth = f"{self.veth}{self.index(host)}-lan"
        subprocess.run(["ip", "-n", f"{self.name}-lan", "link", "set", veth, how], check=True, timeout=10)

    def await_node(self, host: str, state: str, within_s: float = NODE_DOWN_WITHIN_S) -> float:
        """Seconds until the manager reports ``host`` in ``state`` (ready, down)."""
        return wait_until(lambda: self.nodes().get(host, ("gone", ""))[0] == state, within_s, f"{host} {state}")

    def guarded(self) -> set[str]:
        """The nodes whose host guard task runs (a drained node's was stopped with its other tasks;
        made active again, Swarm starts it anew and the runtime labels the node once it passed)."""
        out = self.docker(
            1,
            "service",
            "ps",
            "corral-hostguard",
            "--filter",
            "desired-state=running",
            "--format",
            "{{.Node}} {{.CurrentState}}",
        )
        return {line.split()[0] for line in out.splitlines() if line.split()[1:2] == ["Running"]}

    def labelled(self) -> set[str]:
        """The nodes the runtime labelled guarded (corral.hostguard=on): the only ones it places
        sessions on. A node back from down gets it again on the runtime's next look (30 s at most)."""
        ids = self.docker(1, "node", "ls", "-q").split()
        out = self.docker(
            1,
            "node",
            "inspect",
            "--format",
            '{{.Description.Hostname}} {{index .Spec.Labels "corral.hostguard"}}',
            *ids,
        )
        return {line.split()[0] for line in out.splitlines() if line.split()[1:2] == ["on"]}

    def services(self, session_id: str) -> list[str]:
        """The services Swarm holds for a session (its sandbox, its proxy): none once it ended."""
        out = self.docker(1, "service", "ls", "--filter", f"label=corral.session={session_id}", "--format", "{{.Name}}")
        return [line for line in out.splitlines() if line.strip()]

    def placed(self, session_id: str) -> set[str]:
        """The nodes the services labelled with the session were placed on (its proxy; its sandbox
        too unless it came from the pool)."""
        hosts: set[str] = set()
        for service in self.services(session_id):
            out = self.docker(1, "service", "ps", "--format", "{{.Node}}", service)
            hosts |= {line.strip() for line in out.splitlines() if line.strip()}
        return hosts

    def session_objects(self, session_id: str) -> list[str]:
        """Everything of a session on the manager: services, networks, secrets."""
        found = self.services(session_id)
        for kind in ("network", "secret"):
            out = self.docker(1, kind, "ls", "--filter", f"label=corral.session={session_id}", "--format", "{{.Name}}")
            found += [f"{kind} {line}" for line in out.splitlines() if line.strip()]
        return found

    def gateway_log(self, lines: int = 80) -> str:
        """The gateway container's last lines (it logs to stderr: both streams, as they came)."""
        return self.docker(1, "logs", "--tail", str(lines), f"{self.name}-gateway", merged=True)

    def restart_gateway(self) -> None:
        """The gateway's container restarted on the manager (its data dir kept), as a crash and its
        restart policy would: its sessions run on meanwhile."""
        self.docker(1, "restart", "--time", "10", f"{self.name}-gateway")


def wait_until(ok: Callable[[], bool], within_s: float, what: str, every_s: float = 0.25) -> float:
    started = time.monotonic()
    while not ok():
        assert time.monotonic() - started < within_s, f"not within {within_s:.0f} s: {what}"
        time.sleep(every_s)
    return time.monotonic() - started
