"""Pause and resume, measured: the time a pause takes, the time a resume takes (against a cold
start's create on the same gateway), and the memory a pause frees (the sandbox's and its proxy's
cgroup memory as docker stats counts it, less inactive file cache, and the PSS of their processes,
before the pause and after it), medians over the rounds.

    flock /tmp/corral-bench.lock .venv/bin/python bench/pause_resume.py --rounds 5 [--workspace-mb 16]

Each round: a session with egress control, ``--workspace-mb`` of random bytes in /workspace, a
package's worth of small files in ~/.local, two tabs (data: pages: no upstream needed), a wait for
the browser to settle, then pause and resume through the gateway's HTTP API.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
import httpx

from corral.gateway.server import running
from corral.gateway.settings import GatewaySettings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.integration.dockerutil import DockerHarness
from tests.integration.gateway_fixtures import free_port

KEY = "bench-key-Hx4Tq9Lm2Wv7Rc5Nz8Kb3Jd6Sf"  # strong enough for the gateway to hold
PAGE = "data:text/html,<title>{n}</title><h1>tab {n}</h1>"
SETTLE_S = 8.0  # the browser and the controller settle after the first actions before memory is read


def memory(client: docker.DockerClient, name: str) -> dict[str, float]:
    """A running container's memory in MiB (docker stats' figure; PSS of its cgroup's processes);
    zero for one that is stopped or gone: it holds none."""
    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return {"stats_mib": 0.0, "pss_mib": 0.0}
    if container.status != "running":
        return {"stats_mib": 0.0, "pss_mib": 0.0}
    mem = client.api.stats(container.id, stream=False)["memory_stats"]
    extra = mem.get("stats", {})
    usage = mem["usage"] - extra.get("total_inactive_file", extra.get("inactive_file", 0))
    pss = 0
    procs = Path(f"/sys/fs/cgroup/memory/docker/{container.id}/cgroup.procs")
    if not procs.exists():
        procs = Path(f"/sys/fs/cgroup/system.slice/docker-{container.id}.scope/cgroup.procs")
    for pid in procs.read_text().split() if procs.exists() else []:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return {"stats_mib": usage / 2**20, "pss_mib": pss / 2**20}


def pair_memory(client: docker.DockerClient, session: dict[str, Any]) -> dict[str, float]:
    sandbox = memory(client, session["container"])
    proxy = memory(client, f"corral-egress-{session['id']}")
    return {key: sandbox[key] + proxy[key] for key in sandbox}


def act(c: httpx.Client, session_id: str, action: dict[str, Any]) -> dict[str, Any]:
    reply = c.post(f"/v1/sessions/{session_id}/actions", json={"action": action}, timeout=300).json()
    assert reply.get("ok"), reply
    return dict(reply.get("result") or {})


def one_round(c: httpx.Client, client: docker.DockerClient, workspace_mb: int) -> dict[str, float]:
    started = time.perf_counter()
    made = c.post("/v1/sessions", json={}, timeout=300)
    assert made.status_code == 201, made.text
    create_s = time.perf_counter() - started
    session = made.json()
    sid = session["id"]
    try:
        fill = (
            f"head -c {workspace_mb << 20} /dev/urandom > /workspace/data.bin && "
            'mkdir -p ~/.local/lib/pkg && for i in $(seq 1 200); do echo "x = $i" > ~/.local/lib/pkg/m$i.py; done'
        )
        act(c, sid, {"type": "exec", "command": fill})
        act(c, sid, {"type": "navigate", "url": PAGE.format(n=1)})
        act(c, sid, {"type": "tab_new", "url": PAGE.format(n=2)})
        time.sleep(SETTLE_S)
        before = pair_memory(client, session)
        started = time.perf_counter()
        paused = c.post(f"/v1/sessions/{sid}/pause", timeout=600)
        pause_s = time.perf_counter() - started
        assert paused.status_code == 200, paused.text
        after = pair_memory(client, session)
        started = time.perf_counter()
        resumed = c.post(f"/v1/sessions/{sid}/resume", json={}, timeout=600)
        resume_s = time.perf_counter() - started
        assert resumed.status_code == 200, resumed.text
        tabs = act(c, sid, {"type": "tabs"})["tabs"]
        assert [t["title"] for t in tabs] == ["1", "2"], tabs
        size = act(c, sid, {"type": "exec", "command": "stat -c %s /workspace/data.bin"})["stdout"].strip()
        assert int(size) == workspace_mb << 20, size
    finally:
        c.delete(f"/v1/sessions/{sid}", timeout=120)
    return {
        "create_s": create_s,
        "pause_s": pause_s,
        "resume_s": resume_s,
        "before_stats_mib": before["stats_mib"],
        "after_stats_mib": after["stats_mib"],
        "freed_stats_mib": before["stats_mib"] - after["stats_mib"],
        "before_pss_mib": before["pss_mib"],
        "freed_pss_mib": before["pss_mib"] - after["pss_mib"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workspace-mb", type=int, default=16)
    parser.add_argument("--json", type=Path, help="also write the rounds and medians here")
    args = parser.parse_args()
    instance = f"bench-pause-{os.getpid()}"
    harness, client = DockerHarness(), docker.from_env()
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="corral-bench-pause-") as data_dir:
        settings = GatewaySettings(  # type: ignore[call-arg]
            port=free_port(),
            preview_port=free_port(),  # not 8701: a gateway already running holds it
            data_dir=Path(data_dir),
            api_key=KEY,
            instance=instance,
            pool_size=0,
            network=f"corral-bench-pause-{os.getpid()}",
            egress_network=f"corral-egress-bench-pause-{os.getpid()}",
        )
        try:
            with (
                running(settings),
                httpx.Client(
                    base_url=f"http://127.0.0.1:{settings.port}", headers={"Authorization": f"Bearer {KEY}"}
                ) as c,
            ):
                for n in range(args.rounds):
                    rounds.append(one_round(c, client, args.workspace_mb))
                    print(f"round {n + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in rounds[-1].items()), flush=True)
        finally:
            harness.remove_all({"corral.gateway": instance})
            for network in (settings.network, settings.egress_network):
                harness.remove_network(network)
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print("medians over", len(rounds), "rounds:")
    for key, value in medians.items():
        print(f"  {key:18} {value:8.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"rounds": rounds, "medians": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
