"""Control-plane benchmark: pool claim, cold start to first screenshot, memory per idle session (PSS),
and how many concurrent sessions this machine holds while each answers a screenshot within 1 s.

    scripts/bench --gateway
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from corral.client import SandboxClient
from corral.gateway.server import running
from corral.gateway.settings import GatewaySettings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for what the bench does to Docker beside the runtime
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"
KEY = "bench-key"
ANCHORS = [
    ("Daytona, create to first command (public benchmark)", 110),
    ("E2B, create to first command (public benchmark)", 440),
    ("Browserbase, create + connect (209 + 114 ms)", 323),
]
# Each process's PSS (or, where this uid may not read its smaps, its RSS), by pid (run inside the sandbox).
PSS = r"""
import json, os
out = {}
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        name = open(f'/proc/{pid}/comm').read().strip()
        try:
            kib = sum(int(l.split()[1]) for l in open(f'/proc/{pid}/smaps_rollup') if l.startswith('Pss:'))
            out[pid] = [name, kib, "pss"]
        except OSError:
            rss = [int(l.split()[1]) for l in open(f'/proc/{pid}/status') if l.startswith('VmRSS:')]
            out[pid] = [name, rss[0] if rss else 0, "rss"]
    except OSError:
        continue
print(json.dumps(out))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_pool(http: httpx.Client, ready: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while http.get("/v1/health").json()["sessions"]["pool"] < ready:
        if time.monotonic() > deadline:
            raise RuntimeError("the pool did not fill")
        time.sleep(0.1)


def claim_times(http: httpx.Client, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        wait_pool(http, 1)
        start = time.perf_counter()
        created = http.post("/v1/sessions", json={}).json()
        out.append((time.perf_counter() - start) * 1000)
        assert created["from_pool"], created
        http.delete(f"/v1/sessions/{created['id']}")
    return out


def cold_start_times(http: httpx.Client, samples: int) -> list[float]:
    """Create (a viewport the pool does not hold, so always cold) through the first screenshot."""
    out = []
    for _ in range(samples):
        # Not while the pool refills after the claims (or the last sample): that would time two boots
        # sharing the CPUs, not one cold start.
        wait_pool(http, 1)
        start = time.perf_counter()
        created = http.post("/v1/sessions", json={"viewport": {"width": 1280, "height": 720}}).json()
        with SandboxClient(f"{created['ws_url']}?token={created['token']}") as sb:
            sb.screenshot("jpeg")
        out.append((time.perf_counter() - start) * 1000)
        http.delete(f"/v1/sessions/{created['id']}")
    return out


def idle_pss(http: httpx.Client, runtime: DockerHarness) -> dict[str, float]:
    created = http.post("/v1/sessions", json={}).json()
    with SandboxClient(f"{created['ws_url']}?token={created['token']}") as sb:
        sb.act({"type": "navigate", "url": "data:text/html,<h1>one idle page</h1>"})
    time.sleep(2)  # idle
    # The sandbox's processes belong to two uids: each reads its own smaps; the supervisor and tini,
    # which hold capabilities, no one may read there, so they count by RSS.
    per_pid: dict[str, list[Any]] = {}
    for user in ("corral", "agent"):
        _, out = runtime.exec(created["container"], ["python", "-c", PSS], user=user)
        for pid, (name, kib, kind) in json.loads(out.strip().splitlines()[-1]).items():
            if kind == "pss" or pid not in per_pid:
                per_pid[pid] = [name, kib, kind]
    http.delete(f"/v1/sessions/{created['id']}")
    by_name: dict[str, int] = {}
    for name, kib, _ in per_pid.values():
        by_name[name] = by_name.get(name, 0) + kib
    groups = {"Xvfb": 0.0, "chromium": 0.0, "controller (python + playwright driver)": 0.0, "other": 0.0}
    for name, kib in by_name.items():
        key = (
            "Xvfb"
            if name == "Xvfb"
            else "chromium"
            if name.startswith("chrom")
            else "controller (python + playwright driver)"
            if name in ("python", "node")
            else "other"
        )
        groups[key] += kib / 1024
    groups["total"] = sum(groups.values())
    return {k: round(v, 1) for k, v in groups.items()}


def concurrency(http: httpx.Client, limit: int) -> tuple[int, list[dict[str, Any]]]:
    """Add sessions one at a time; after each, every session takes a screenshot at once."""
    sessions: list[dict[str, Any]] = []
    clients: list[SandboxClient] = []
    steps = []
    held = 0
    try:
        while len(sessions) < limit:
            created = http.post("/v1/sessions", json={})
            if created.status_code != 201:
                break
            info = created.json()
            sessions.append(info)
            client = SandboxClient(f"{info['ws_url']}?token={info['token']}")
            client.__enter__()
            clients.append(client)

            def shot(c: SandboxClient) -> float:
                start = time.perf_counter()
                c.act({"type": "screenshot", "format": "jpeg"})
                return (time.perf_counter() - start) * 1000

            with ThreadPoolExecutor(max_workers=len(clients)) as pool:
                latencies = list(pool.map(shot, clients))
            worst = max(latencies)
            steps.append(
                {
                    "sessions": len(sessions),
                    "worst_ms": round(worst, 1),
                    "median_ms": round(statistics.median(latencies), 1),
                }
            )
            if worst > 1000:
                break
            held = len(sessions)
    finally:
        for client in clients:
            client.__exit__(None, None, None)
        for info in sessions:
            http.delete(f"/v1/sessions/{info['id']}")
    return held, steps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--max-concurrent", type=int, default=16)
    args = parser.parse_args()
    runtime = DockerHarness()
    instance = f"bench-{os.getpid()}"
    settings = GatewaySettings(
        port=free_port(),
        data_dir=Path(tempfile.mkdtemp(prefix="corral-bench-")),
        api_key=KEY,
        instance=instance,
        pool_size=1,
        max_sessions=args.max_concurrent + 2,
        max_sessions_per_key=args.max_concurrent + 2,
        network=f"corral-bench-{os.getpid()}",
    )
    try:
        with (
            running(settings) as url,
            httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as http,
        ):
            claims = claim_times(http, args.samples)
            colds = cold_start_times(http, args.samples)
            pss = idle_pss(http, runtime)
            held, steps = concurrency(http, args.max_concurrent)
    finally:
        # Sandboxes, their proxies and session networks, then the bench's own network: a machine that
        # runs the bench often would run out of Docker's address pools otherwise.
        runtime.remove_all({"corral.gateway": instance})
        runtime.remove_network(settings.network)

    claim_p50, cold_p50 = statistics.median(claims), statistics.median(colds)
    print(f"{'Control plane':<56}{'p50 ms':>10}{'max ms':>10}{'n':>5}")
    print(
        f"  {'claim from the warm pool (POST /v1/sessions)':<54}{claim_p50:>10.1f}{max(claims):>10.1f}{len(claims):>5}"
    )
    print(f"  {'cold start to first screenshot, with egress':<54}{cold_p50:>10.1f}{max(colds):>10.1f}{len(colds):>5}")
    print("\nPublished anchors (not measured here)")
    for name, ms in ANCHORS:
        print(f"  {name:<54}{ms:>10}")
    print("\nMemory of one idle session, PSS (MiB)")
    for name, mib in pss.items():
        print(f"  {name:<54}{mib:>10.1f}")
    print(f"\nConcurrent sessions answering a screenshot within 1 s: {held} (tried up to {args.max_concurrent})")
    for step in steps:
        print(
            f"  {step['sessions']:>3} sessions: worst {step['worst_ms']:>7.1f} ms, median {step['median_ms']:>6.1f} ms"
        )
    # Issue 16's wanted figures, never loosened: the claim's was 3.1 ms before egress, 123 ms after.
    budgets = {
        "claim from the warm pool p50": (claim_p50, 20.0),
        "cold start to first screenshot with egress p50": (cold_p50, 1500.0),
    }
    print("\nBudgets")
    for name, (value, budget) in budgets.items():
        print(f"  {name:<44}{value:>8.1f} ms  <= {budget:>6.0f} ms  {'ok' if value <= budget else 'OVER'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gateway.json").write_text(
        json.dumps(
            {
                "claim_ms": claims,
                "cold_start_ms": colds,
                "idle_pss_mib": pss,
                "concurrent_within_1s": held,
                "steps": steps,
                "budgets": {k: {"p50_ms": round(v, 1), "budget_ms": b} for k, (v, b) in budgets.items()},
            },
            indent=2,
        )
    )
    print(f"\nwrote {RESULTS / 'gateway.json'}")
    return 0 if all(v <= b for v, b in budgets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
