"""Idle cost of the control plane: the gateway's own CPU and Docker's (dockerd and its containerd) while
N sessions sit idle, per session, beside the same window with none (the warm pool alone), the
egress proxies' and the sandboxes' CPU over the same window, and the gateway's memory (RSS, USS).
What the gateway's reaper and watchdog cost each second is what limits density on a small machine
once the sessions themselves are quiet.

    python bench/idle.py [--sessions 8] [--window 30]

The gateway runs in this process (a thread); during each window this process only sleeps, so its CPU
time is the gateway's. Read /proc: run as root (or as the user dockerd runs as) for Docker's part.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from corral.runtime.docker import DockerRuntime

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.density import cpu_s, memory_mib
from bench.gateway import bench_gateway, wait_pool
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"
TICK_S = os.sysconf("SC_CLK_TCK")
SETTLE_S = 5.0  # after the last create: its refill done, the first watchdog rounds over


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S


def docker_pids() -> list[int]:
    """dockerd and the containerd it runs (not the per-container shims: those are the containers' own)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if name in ("dockerd", "containerd"):
            out.append(int(entry.name))
    return out


# The gateway's Docker calls that a quiet gateway makes on its own (the reaper's and the watchdog's),
# counted by wrapping the runtime's methods in this process: a figure the other users of a shared
# Docker daemon do not blur, as they do its CPU time.
WATCHED_CALLS = ("sandbox_states", "proxy_states", "exit_info", "list_sandboxes", "restart_proxy")
CALLS: dict[str, int] = dict.fromkeys(WATCHED_CALLS, 0)


def count_docker_calls() -> None:
    for name in WATCHED_CALLS:
        original = getattr(DockerRuntime, name)

        def counted(self: DockerRuntime, *args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            CALLS[_name] += 1
            return _original(self, *args, **kw)

        setattr(DockerRuntime, name, counted)


def containers_cpu(runtime: DockerHarness, instance: str) -> tuple[float, float]:
    """The CPU seconds every egress proxy and every sandbox (the pool's among them) of ``instance``
    used so far (docker stats' counter)."""
    proxies = sandboxes = 0.0
    for container in runtime.client.containers.list(filters={"label": f"corral.gateway={instance}"}):
        if "egress" in (container.name or ""):
            proxies += runtime.cpu_seconds(container.id)
        else:
            sandboxes += runtime.cpu_seconds(container.id)
    return proxies, sandboxes


def window(runtime: DockerHarness, instance: str, seconds: float) -> dict[str, float]:
    """CPU seconds per minute of the gateway, Docker and the proxies over ``seconds`` of idleness."""
    dockers = docker_pids()
    proxies0, sandboxes0 = containers_cpu(runtime, instance)
    calls0 = sum(CALLS.values())
    gateway0, docker0 = cpu_s(), sum(_proc_cpu(pid) for pid in dockers)
    time.sleep(seconds)
    gateway1, docker1 = cpu_s(), sum(_proc_cpu(pid) for pid in dockers)
    calls1 = sum(CALLS.values())
    proxies1, sandboxes1 = containers_cpu(runtime, instance)
    rss, uss = memory_mib()
    per_min = 60.0 / seconds
    return {
        "gateway_s_per_min": round((gateway1 - gateway0) * per_min, 3),
        "docker_s_per_min": round((docker1 - docker0) * per_min, 3),
        "proxies_s_per_min": round((proxies1 - proxies0) * per_min, 3),
        "sandboxes_s_per_min": round((sandboxes1 - sandboxes0) * per_min, 3),
        "gateway_rss_mib": round(rss, 1),
        "gateway_uss_mib": round(uss, 1),
        "docker_calls_per_min": round((calls1 - calls0) * per_min, 1),
    }


def idle_cpu(
    http: httpx.Client, runtime: DockerHarness, instance: str, sessions: int, seconds: float
) -> dict[str, Any]:
    """The windows with no session and with ``sessions`` idle ones; the added cost per session."""
    wait_pool(http, 1)
    time.sleep(SETTLE_S)
    empty = window(runtime, instance, seconds)
    created = [http.post("/v1/sessions", json={}).json() for _ in range(sessions)]
    try:
        wait_pool(http, 1)
        time.sleep(SETTLE_S)
        full = window(runtime, instance, seconds)
    finally:
        for info in created:
            http.delete(f"/v1/sessions/{info['id']}")
    per_session = {k: round((full[k] - empty[k]) / sessions, 4) for k in full}
    return {"sessions": sessions, "window_s": seconds, "none": empty, "idle": full, "per_session": per_session}


def print_rows(result: dict[str, Any]) -> None:
    n = result["sessions"]
    print(f"{'Idle CPU, seconds per minute':<56}{'none':>10}{f'{n} idle':>10}{'/session':>10}")
    for key, label in (
        ("gateway_s_per_min", "gateway process (reaper, watchdog, server)"),
        ("docker_s_per_min", "dockerd + containerd"),
        ("proxies_s_per_min", "egress proxies (all of them)"),
        ("sandboxes_s_per_min", "sandboxes (all of them, the pool's too)"),
        ("docker_calls_per_min", "the gateway's Docker calls per minute (not CPU)"),
    ):
        row = (result["none"][key], result["idle"][key], result["per_session"][key])
        print(f"  {label:<54}{row[0]:>10.3f}{row[1]:>10.3f}{row[2]:>10.4f}")
    print(f"{'Gateway memory, MiB':<56}")
    for key, label in (
        ("gateway_rss_mib", "gateway process RSS"),
        ("gateway_uss_mib", "gateway process USS (private)"),
    ):
        row = (result["none"][key], result["idle"][key], result["per_session"][key])
        print(f"  {label:<54}{row[0]:>10.1f}{row[1]:>10.1f}{row[2]:>10.2f}")
    per = result["per_session"]
    gw = per["gateway_s_per_min"] + per["docker_s_per_min"]
    print(f"  {'gateway + Docker per idle session, % of one core':<54}{gw / 60 * 100:>29.3f}% (stated)")
    whole = gw + per["proxies_s_per_min"] + per["sandboxes_s_per_min"]
    print(f"  {'all of it per idle session (sandbox and proxy too)':<54}{whole / 60 * 100:>29.3f}% (stated)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--window", type=float, default=30.0)
    args = parser.parse_args()
    count_docker_calls()
    runtime = DockerHarness()
    with bench_gateway(runtime, args.sessions + 2) as (settings, http):
        result = idle_cpu(http, runtime, settings.instance, args.sessions, args.window)
    print_rows(result)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "idle.json").write_text(json.dumps(result, indent=2))
    print(f"\nwrote {RESULTS / 'idle.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
