"""Control-plane benchmark: pool claim, cold start to first screenshot, memory per idle session (PSS),
and how many concurrent sessions this machine holds while each answers a screenshot within 1 s.

    scripts/bench --gateway
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from corral.client import SandboxClient
from corral.gateway.server import running
from corral.gateway.settings import GatewaySettings
from corral.sandbox.settings import ControllerSettings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for what the bench does to Docker beside the runtime
from bench.density import DENSITY_BUDGET, find_limit, print_result
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"
KEY = "bench-key-Hx4Tq9Lm2Wv7Rc5Nz8Kb3Jd6Sf"  # strong enough for the gateway to hold
ANCHORS = [
    ("Daytona, create to first command (public benchmark)", 110),
    ("E2B, create to first command (public benchmark)", 440),
    ("Browserbase, create + connect (209 + 114 ms)", 323),
]
# Each process's PSS (or, where this uid may not read its smaps, its RSS), by pid (run inside the sandbox),
# leaving out the reader itself; Chromium's children named by their --type.
PSS = r"""
import json, os
out = {}
for pid in filter(str.isdigit, os.listdir('/proc')):
    if pid == str(os.getpid()):
        continue
    try:
        name = open(f'/proc/{pid}/comm').read().strip()
        args = open(f'/proc/{pid}/cmdline').read().replace(chr(0), ' ').split()  # Chromium's children rewrite theirs
        kind = [a.split('=', 1)[1] for a in args if a.startswith(('--type=', '--utility-sub-type='))]
        kind += [args[args.index('-m') + 1]] if name == 'python' and '-m' in args[:-1] else []
        name = ' '.join([name, *kind[-1:]])
        try:
            rows = [l.split() for l in open(f'/proc/{pid}/smaps_rollup')]
            kib = sum(int(r[1]) for r in rows if r[0] == 'Pss:')
            private = sum(int(r[1]) for r in rows if r[0] in ('Private_Clean:', 'Private_Dirty:'))
            out[pid] = [name, kib, "pss", private]
        except OSError:
            rss = [int(l.split()[1]) for l in open(f'/proc/{pid}/status') if l.startswith('VmRSS:')]
            out[pid] = [name, rss[0] if rss else 0, "rss", rss[0] if rss else 0]
    except OSError:
        continue
print(json.dumps(out))
"""


# Issue 31's budgets (issue 16's: a cold start 1,500 ms, 300 MiB a session and no sidecar budget).
COLD_START_BUDGET_MS = 1000.0
IDLE_PSS_BUDGET_MIB = 250.0
SIDECAR_PSS_BUDGET_MIB = 50.0
# An idle session: one whose Playwright driver has stopped (the controller stops it after this long
# without a browser call; corral.sandbox.web.browser), measured a few seconds after that.
IDLE_AFTER_S = ControllerSettings.model_fields["browser_idle_stop_s"].default + 3
SIDECAR_ROW = "egress sidecar (beside, not in the total)"


def budget_line(name: str, value: float, unit: str, op: str, budget: float) -> bool:
    """One row of the Budgets block, printed; whether it holds."""
    ok = value <= budget if op == "<=" else value >= budget
    print(f"  {name:<48}{value:>8.1f} {unit:<3} {op} {budget:>6.0f} {unit:<3} {'ok' if ok else 'OVER'}")
    return ok


def memory_budgets(pss: dict[str, float]) -> list[bool]:
    """The idle session's and its egress sidecar's PSS rows of the Budgets block; whether each holds."""
    return [
        budget_line("idle session PSS", pss["total"], "MiB", "<=", IDLE_PSS_BUDGET_MIB),
        budget_line("egress sidecar PSS", pss[SIDECAR_ROW], "MiB", "<=", SIDECAR_PSS_BUDGET_MIB),
    ]


@contextlib.contextmanager
def bench_gateway(runtime: DockerHarness, max_sessions: int) -> Iterator[tuple[GatewaySettings, httpx.Client]]:
    """A running gateway of the bench's own (instance, network and data dir named by this process),
    with a pool of one and room for ``max_sessions``, and a client with its key. Afterwards its
    sandboxes, their proxies and session networks go, then its own network: a machine that runs the
    benches often would run out of Docker's address pools otherwise."""
    settings = GatewaySettings(
        port=free_port(),
        preview_port=free_port(),  # gateways side by side: each its own preview listener
        data_dir=Path(tempfile.mkdtemp(prefix="corral-bench-")),
        api_key=KEY,
        instance=f"bench-{os.getpid()}",
        pool_size=1,
        max_sessions=max_sessions,
        max_sessions_per_key=max_sessions,
        network=f"corral-bench-{os.getpid()}",
    )
    try:
        with (
            running(settings) as url,
            httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as http,
        ):
            yield settings, http
    finally:
        runtime.remove_all({"corral.gateway": settings.instance})
        runtime.remove_network(settings.network)


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


def wait_grounds(http: httpx.Client, timeout_s: float = 120) -> None:
    """Until the grounds a cold start takes (its network, CA and proxy, made ahead) are made again."""
    deadline = time.monotonic() + timeout_s
    while True:
        grounds = http.get("/v1/health").json().get("grounds", {"held": 0, "target": 0})
        if grounds["held"] >= grounds["target"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the grounds were not made again: {grounds}")
        time.sleep(0.1)


def one_cold_start(http: httpx.Client) -> float:
    """Create (a viewport the pool does not hold, so always cold) through the first screenshot (ms)."""
    start = time.perf_counter()
    created = http.post("/v1/sessions", json={"viewport": {"width": 1280, "height": 720}}).json()
    with SandboxClient(f"{created['ws_url']}?token={created['token']}") as sb:
        sb.screenshot("jpeg")
    took = (time.perf_counter() - start) * 1000
    http.delete(f"/v1/sessions/{created['id']}")
    return took


def cold_start_times(http: httpx.Client, samples: int, back_to_back: list[float] | None = None) -> list[float]:
    """Cold starts on a settled gateway; with ``back_to_back``, each followed at once by another,
    appended there (the first's ground, and its pool's, still being made again)."""
    out = []
    for _ in range(samples):
        # Not while the pool refills after the claims (or the last sample), nor while the last start's
        # ground is made again (a proxy booting): that would time two boots sharing the CPUs, not one
        # cold start.
        wait_pool(http, 1)
        wait_grounds(http)
        out.append(one_cold_start(http))
        if back_to_back is not None:
            back_to_back.append(one_cold_start(http))
    return out


# Every Python this bench runs in a sandbox is isolated (-I): docker exec starts it in the agent's
# home, the image's working directory, where the agent may have planted a module of any name.
# The supervisor and the launcher hold CAP_SETUID/SETGID(/SETPCAP): only a reader of their uid holding
# as much may read their smaps (else they would count by RSS, their forks' shared pages counted again).
_CAPPED_READER = "-all,+setuid,+setgid,+setpcap"
IDLE_CPU_WINDOW_S = 10.0


def _pss_as(runtime: DockerHarness, container: str, user: str) -> dict[str, list[Any]]:
    if user == "corral":
        argv = ["setpriv", "--reuid=corral", "--regid=corral", "--clear-groups", f"--inh-caps={_CAPPED_READER}"]
        argv += [f"--ambient-caps={_CAPPED_READER}", "--", "python", "-I", "-c", PSS]
        out = runtime._container(container).exec_run(argv, user="root").output.decode(errors="replace")
    else:
        _, out = runtime.exec(container, ["python", "-I", "-c", PSS], user=user)
    parsed: dict[str, list[Any]] = json.loads(out.strip().splitlines()[-1])
    return parsed


def sidecar_pss(runtime: DockerHarness, instance: str, sandbox: str, shared: str) -> float:
    """The session's egress sidecar's PSS (MiB), beside the session's (it has one uid; root reads it).
    It is the egress container on the sandbox's own session network (the pooled pair has another)."""
    networks = set(runtime._container(sandbox).attrs["NetworkSettings"]["Networks"]) - {shared}
    total = 0.0
    for container in runtime.client.containers.list(filters={"label": f"corral.gateway={instance}"}):
        on = set(container.attrs["NetworkSettings"]["Networks"])
        if container.id != runtime._container(sandbox).id and "egress" in (container.name or "") and on & networks:
            out = container.exec_run(["python3", "-I", "-c", PSS]).output.decode(errors="replace")
            total += sum(row[1] for row in json.loads(out.strip().splitlines()[-1]).values()) / 1024
    return round(total, 1)


def idle_pss(http: httpx.Client, runtime: DockerHarness, instance: str, network: str) -> dict[str, float]:
    """One session idle after a navigation: PSS by process group, the sidecar's beside it, and the
    session's CPU (% of one core) over a quiet window with the pool full (no boot beside it)."""
    created = http.post("/v1/sessions", json={}).json()
    with SandboxClient(f"{created['ws_url']}?token={created['token']}") as sb:
        sb.act({"type": "navigate", "url": "data:text/html,<h1>one idle page</h1>"})
    navigated = time.monotonic()
    wait_pool(http, 1)
    time.sleep(max(2.0, IDLE_AFTER_S - (time.monotonic() - navigated)))  # idle
    cpu_start = runtime.cpu_seconds(created["container"])
    time.sleep(IDLE_CPU_WINDOW_S)
    idle_cpu = (runtime.cpu_seconds(created["container"]) - cpu_start) / IDLE_CPU_WINDOW_S * 100
    # The sandbox's processes belong to three uids (two on images before Chromium's own): each reads
    # its own smaps (tini, root's, by RSS).
    per_pid: dict[str, list[Any]] = {}
    code, _ = runtime.exec(created["container"], ["id", "browser"], user="root")
    for user in ("corral", "agent", "browser") if code == 0 else ("corral", "agent"):
        for pid, (name, kib, kind, private) in _pss_as(runtime, created["container"], user).items():
            if kind == "pss" or pid not in per_pid:
                per_pid[pid] = [name, kib, kind, private]
    sidecar = sidecar_pss(runtime, instance, created["container"], network)
    http.delete(f"/v1/sessions/{created['id']}")
    by_name: dict[str, int] = {}
    for name, kib, _, _ in per_pid.values():
        by_name[name] = by_name.get(name, 0) + kib
    processes = {
        f"  {name} x{sum(1 for row in per_pid.values() if row[0] == name)}": kib / 1024
        for name, kib in sorted(by_name.items(), key=lambda item: -item[1])
    }
    groups = {"Xvfb": 0.0, "chromium": 0.0, "controller (python + playwright driver)": 0.0, "other": 0.0}
    for name, kib in by_name.items():
        key = (
            "Xvfb"
            if name == "Xvfb"
            else "chromium"
            if name.startswith("chrom")
            else "controller (python + playwright driver)"
            if name in ("python corral.sandbox.controller", "node")
            or name.startswith("node-")  # the driver's main thread names it
            else "other"
        )
        groups[key] += kib / 1024
    groups["total"] = sum(groups.values())
    groups.update(processes)
    # Private memory (USS): PSS shares the image's file pages with every sandbox on the host, so it
    # moves with how many run; the private part is what a change to the session itself moves.
    groups["private (USS), all processes"] = sum(row[3] for row in per_pid.values()) / 1024
    groups[SIDECAR_ROW] = sidecar
    groups["idle CPU, % of one core"] = idle_cpu
    return {k: round(v, 1) for k, v in groups.items()}


def cold_rows(claims: list[float], colds: list[float], back_to_back: list[float]) -> int:
    """The claim's and the cold start's rows beside their budgets (``--cold-only``), and the cold
    start right after another one (stated, not budgeted: two boots sharing the cores)."""
    claim_p50, cold_p50 = statistics.median(claims), statistics.median(colds)
    print(f"{'Control plane':<56}{'p50 ms':>10}{'max ms':>10}{'n':>5}")
    print(f"  {'claim from the warm pool':<54}{claim_p50:>10.1f}{max(claims):>10.1f}{len(claims):>5}")
    print(f"  {'cold start to first screenshot, with egress':<54}{cold_p50:>10.1f}{max(colds):>10.1f}{len(colds):>5}")
    b2b, n = statistics.median(back_to_back), len(back_to_back)
    print(f"  {'  the same, right after another (stated)':<54}{b2b:>10.1f}{max(back_to_back):>10.1f}{n:>5}")
    print("\nBudgets")
    ok = [
        budget_line("claim from the warm pool p50", claim_p50, "ms", "<=", 20.0),
        budget_line("cold start to first screenshot with egress p50", cold_p50, "ms", "<=", COLD_START_BUDGET_MS),
    ]
    return 0 if all(ok) else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--max-concurrent", type=int, default=60, help="the density search's ceiling")
    parser.add_argument("--idle-only", action="store_true", help="only the idle session's memory and CPU")
    parser.add_argument("--cold-only", action="store_true", help="only the claim and the cold start rows")
    args = parser.parse_args()
    runtime = DockerHarness()
    with bench_gateway(runtime, args.max_concurrent + 2) as (settings, http):
        if args.idle_only:
            wait_pool(http, 1)
            pss = idle_pss(http, runtime, settings.instance, settings.network)
            for name, mib in pss.items():
                print(f"  {name:<54}{mib:>10.1f}")
            print("\nBudgets")
            return 0 if all(memory_budgets(pss)) else 1
        claims = claim_times(http, args.samples)
        if args.cold_only:
            back_to_back: list[float] = []
            colds = cold_start_times(http, args.samples, back_to_back)
            return cold_rows(claims, colds, back_to_back)
        colds = cold_start_times(http, args.samples)
        pss = idle_pss(http, runtime, settings.instance, settings.network)
        print("Density: sessions added one at a time, a burst of screenshots after each", flush=True)
        density = find_limit(http, args.max_concurrent)

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
    print(f"  {'idle CPU per session':<54}{pss['idle CPU, % of one core']:>9.2f}% of one core (stated)")
    print_result(density, args.max_concurrent)
    # Issue 16's wanted figures, never loosened: the claim's was 3.1 ms before egress, 123 ms after.
    budgets = {
        "claim from the warm pool p50": (claim_p50, 20.0),
        "cold start to first screenshot with egress p50": (cold_p50, COLD_START_BUDGET_MS),
    }
    print("\nBudgets")
    timing_ok = [budget_line(name, value, "ms", "<=", budget) for name, (value, budget) in budgets.items()]
    density_ok = [
        *memory_budgets(pss),
        budget_line("sessions answering a screenshot within 1 s", density["held"], "", ">=", DENSITY_BUDGET),
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gateway.json").write_text(
        json.dumps(
            {
                "claim_ms": claims,
                "cold_start_ms": colds,
                "idle_pss_mib": pss,
                "concurrent_within_1s": density["held"],
                "density": density,
                "budgets": {k: {"p50_ms": round(v, 1), "budget_ms": b} for k, (v, b) in budgets.items()},
            },
            indent=2,
        )
    )
    print(f"\nwrote {RESULTS / 'gateway.json'}")
    return 0 if all(timing_ok) and all(density_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
