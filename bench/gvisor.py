"""Corral's sandbox under runc and under gVisor (runsc), side by side in one run (docs/gvisor.md).

Needs ``runsc`` registered with dockerd (``/etc/docker/daemon.json``, ``runtimeArgs: ["--network=host"]``).
Per round, in alternating order, it cold-starts one sandbox per runtime and times container start to
the first screenshot; then, with one sandbox of each kind running, it times click round trips and
JPEG screenshots over the controller's WebSocket in alternating blocks, reads each sandbox's memory,
and reports what boot and init could set up (firewall, the uid split). Medians over the rounds.

    PYTHONPATH=services python bench/gvisor.py [--rounds 5] [--samples 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import docker

from corral.client import SandboxClient
from corral.runtime import SandboxAddress, SandboxSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for what the bench does to Docker beside the runtime
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"
RUNTIMES: dict[str, str | None] = {"runc": None, "runsc": "runsc"}
PAGE = "data:text/html;charset=utf-8," + urllib.parse.quote(
    "<!doctype html><title>gvisor</title><textarea style='width:600px;height:300px'></textarea>"
    "<p style='font:24px sans-serif'>" + "row " * 200 + "</p>"
)


def first_screenshot(sandbox: SandboxAddress, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with SandboxClient(sandbox.ws_url, controller_secret=sandbox.secret) as client:
                client.act({"type": "screenshot", "format": "jpeg"})
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def cold_start(
    runtime: DockerHarness, image: str, name: str, oci: str | None
) -> tuple[SandboxAddress, dict[str, float]]:
    start = time.monotonic()
    sandbox = runtime.start_sandbox(SandboxSpec(image=image, name=name, runtime=oci, labels={"corral.test": "1"}))
    started = time.monotonic() - start
    runtime.wait_ready(sandbox, 120)
    healthz = time.monotonic() - start
    first_screenshot(sandbox, 60)
    return sandbox, {"started_s": started, "healthz_s": healthz, "first_screenshot_s": time.monotonic() - start}


def timed(samples: int, fn: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def memory(client: docker.DockerClient, container_id: str) -> dict[str, float]:
    """docker stats' figure (usage less inactive file cache), and the PSS of every host process in the
    container's memory cgroup (for runsc: the sentry, its stubs and the gofer), in MiB."""
    stats = client.api.stats(container_id, stream=False)
    mem = stats["memory_stats"]
    extra = mem.get("stats", {})
    usage = mem["usage"] - extra.get("total_inactive_file", extra.get("inactive_file", 0))
    pss = 0
    procs = Path(f"/sys/fs/cgroup/memory/docker/{container_id}/cgroup.procs")
    if not procs.exists():
        procs = Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cgroup.procs")
    for pid in procs.read_text().split() if procs.exists() else []:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return {"docker_stats_mib": usage / 2**20, "pss_mib": pss / 2**20}


def inspect(runtime: DockerHarness, sandbox: SandboxAddress) -> dict[str, object]:
    logs = runtime.logs(sandbox.id, 400)
    _, users = runtime.exec(sandbox.id, ["ps", "-eo", "user=,comm="], user="root")
    chromium_users = sorted({line.split()[0] for line in users.splitlines() if "chromium" in line})
    return {
        "firewall_set": "no firewall for the agent's uid" not in logs,
        "uid_split": "started without CAP_SETUID" not in logs,
        "chromium_runs_as": chromium_users,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--image", default=os.environ.get("CORRAL_IMAGE", "corral-desktop:latest"))
    args = parser.parse_args()

    runtime = DockerHarness()
    api = docker.from_env()
    if "runsc" not in (api.info().get("Runtimes") or {}):
        print("runsc is not registered with dockerd (docs/gvisor.md)", file=sys.stderr)
        return 2
    starts: dict[str, list[dict[str, float]]] = {k: [] for k in RUNTIMES}
    latency: dict[str, dict[str, list[float]]] = {k: {"click": [], "screenshot jpeg": []} for k in RUNTIMES}
    mem: dict[str, list[dict[str, float]]] = {k: [] for k in RUNTIMES}
    checks: dict[str, dict[str, object]] = {}
    for round_no in range(args.rounds):
        order = list(RUNTIMES) if round_no % 2 == 0 else list(reversed(RUNTIMES))
        sandboxes: dict[str, SandboxAddress] = {}
        try:
            for kind in order:
                name = f"corral-gvisor-bench-{kind}-{os.getpid()}-{round_no}"
                sandboxes[kind], timing = cold_start(runtime, args.image, name, RUNTIMES[kind])
                starts[kind].append(timing)
                print(f"round {round_no} {kind}: {json.dumps({k: round(v, 2) for k, v in timing.items()})}", flush=True)
            clients = {
                kind: SandboxClient(sb.ws_url, controller_secret=sb.secret).__enter__()
                for kind, sb in sandboxes.items()
            }
            try:
                for client in clients.values():
                    client.act({"type": "navigate", "url": PAGE})
                for _block in range(4):  # alternating blocks, so drift in the host's load hits both
                    for kind in order:
                        client = clients[kind]
                        n = max(1, args.samples // 4)
                        latency[kind]["click"] += timed(
                            n, lambda c=client: c.act({"type": "click", "x": 300, "y": 150})
                        )
                        latency[kind]["screenshot jpeg"] += timed(
                            n, lambda c=client: c.act({"type": "screenshot", "format": "jpeg"})
                        )
            finally:
                for client in clients.values():
                    client.__exit__(None, None, None)
            for kind, sb in sandboxes.items():
                mem[kind].append(memory(api, sb.id))
                checks[kind] = inspect(runtime, sb)
        finally:
            for sb in sandboxes.values():
                runtime.remove(sb.id)

    out: dict[str, object] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rounds": args.rounds}
    for kind in RUNTIMES:
        out[kind] = {
            **{k: round(statistics.median(t[k] for t in starts[kind]), 2) for k in starts[kind][0]},
            **{f"{k} p50_ms": round(statistics.median(v), 2) for k, v in latency[kind].items()},
            **{k: round(statistics.median(m[k] for m in mem[kind]), 1) for k in mem[kind][0]},
            "checks": checks[kind],
        }
    print(json.dumps(out, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gvisor.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
