"""Commands: ``exec`` of ``true`` over the WebSocket through the gateway, against ``docker exec``.

Both are measured the same way in one run, interleaved: the wall time from sending the request to
having the exit code. ``argv: ["true"]`` starts the program directly; ``command: "true"`` goes
through ``bash -lc`` as agents' shell commands do. ``docker exec SANDBOX true`` is the Docker CLI,
what a control plane without an in-sandbox process runner does for every command.

    scripts/bench    (or alone: .venv/bin/python bench/exec.py --samples 200)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from corral.client import SandboxClient
from corral.gateway.server import running
from corral.gateway.settings import GatewaySettings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for what the bench does to Docker beside the runtime
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"
KEY = "bench-key"
BUDGET_P50_MS = 5.0
BUDGET_RATIO = 10.0  # exec through the gateway at least this many times faster than docker exec (p50)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure(client: SandboxClient, container: str, samples: int, docker_every: int) -> dict[str, list[float]]:
    def exec_argv() -> None:
        result = client.act({"type": "exec", "argv": ["true"]})["result"]
        assert result["exit_code"] == 0, result

    def exec_command() -> None:
        result = client.act({"type": "exec", "command": "true"})["result"]
        assert result["exit_code"] == 0, result

    def docker_exec() -> None:
        subprocess.run(["docker", "exec", container, "true"], check=True, capture_output=True)

    for _ in range(10):  # warm: the launcher's first fork, bash's first start
        exec_argv()
        exec_command()
    out: dict[str, list[float]] = {"exec argv true": [], "exec command true (bash -lc)": [], "docker exec true": []}
    for index in range(samples):
        out["exec argv true"].append(timed(exec_argv))
        out["exec command true (bash -lc)"].append(timed(exec_command))
        if index % docker_every == 0:
            out["docker exec true"].append(timed(docker_exec))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--docker-every", type=int, default=5, help="one docker exec per this many exec samples")
    args = parser.parse_args()
    runtime = DockerHarness()
    instance = f"bench-exec-{os.getpid()}"
    settings = GatewaySettings(
        port=free_port(),
        data_dir=Path(tempfile.mkdtemp(prefix="corral-bench-")),
        api_key=KEY,
        instance=instance,
        pool_size=0,
        network=f"corral-bench-{os.getpid()}",
    )
    try:
        with (
            running(settings) as url,
            httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as http,
        ):
            created = http.post("/v1/sessions", json={}).json()
            with SandboxClient(f"{created['ws_url']}?token={created['token']}") as client:
                client.screenshot("jpeg")  # ready
                times = measure(client, created["container"], args.samples, args.docker_every)
            http.delete(f"/v1/sessions/{created['id']}")
    finally:
        runtime.remove_all({"corral.gateway": instance})
        runtime.remove_network(settings.network)

    print(f"{'Commands (round trip, ms)':<44}{'p50':>9}{'p95':>9}{'n':>6}")
    summary = {}
    for name, values in times.items():
        p50, p95 = statistics.median(values), percentile(values, 0.95)
        summary[name] = {"p50_ms": round(p50, 2), "p95_ms": round(p95, 2), "n": len(values)}
        print(f"  {name:<42}{p50:>9.2f}{p95:>9.2f}{len(values):>6}")
    argv_p50 = summary["exec argv true"]["p50_ms"]
    docker_p50 = summary["docker exec true"]["p50_ms"]
    ratio = docker_p50 / argv_p50
    print(f"\n  docker exec / exec through the gateway (p50): {ratio:.1f}x")
    checks = {
        f"exec p50 <= {BUDGET_P50_MS} ms": argv_p50 <= BUDGET_P50_MS,
        f">= {BUDGET_RATIO:.0f}x faster than docker exec": ratio >= BUDGET_RATIO,
    }
    print("\nBudgets")
    for name, ok in checks.items():
        print(f"  {name:<44}{'ok' if ok else 'OVER'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "exec.json").write_text(
        json.dumps({"samples": times, "summary": summary, "ratio_docker_over_exec": round(ratio, 1)}, indent=2)
    )
    print(f"\nwrote {RESULTS / 'exec.json'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
