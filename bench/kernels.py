"""run_code through the gateway: the first call of a context (its kernel cold: started, then the
cell), a warm trivial cell's round trip against ``exec`` of ``python3 -c pass`` (interleaved, in a
new random order each round), and the controller's memory (RSS) before any kernel, with one, and
after it is removed (pyzmq stays loaded once it was).

    .venv/bin/python bench/kernels.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.sdk import Sandbox

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for bench.files and tests.integration
from bench.files import KEY, gateway_process
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"

Call = Callable[[Sandbox], dict[str, Any]]

SERIES: dict[str, Call] = {
    "run_code 'pass' (warm kernel)": lambda sb: sb.request({"action": {"type": "run_code", "code": "pass"}}),
    "exec python3 -c pass": lambda sb: sb.request({"action": {"type": "exec", "argv": ["python3", "-c", "pass"]}}),
    "exec true": lambda sb: sb.request({"action": {"type": "exec", "argv": ["true"]}}),
}


def _ok(reply: dict[str, Any], what: str) -> dict[str, Any]:
    if not reply.get("ok"):
        raise RuntimeError(f"{what}: {reply.get('error')}")
    return reply


def cold_starts(sb: Sandbox, samples: int) -> list[float]:
    """A new context's first call (kernel start, then ``1``), each removed after (one kernel at a time)."""
    out = []
    for n in range(samples):
        context = f"cold{n}"
        started = time.perf_counter()
        _ok(sb.request({"action": {"type": "run_code", "code": "1", "context": context}}), "cold run_code")
        out.append((time.perf_counter() - started) * 1000)
        _ok(sb.request({"action": {"type": "remove_code_context", "context": context}}), "remove")
    return out


def warm_rounds(sb: Sandbox, rounds: int, seed: int = 17) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in SERIES}
    order = list(SERIES)
    shuffle = random.Random(seed).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            started = time.perf_counter()
            _ok(SERIES[name](sb), name)
            times[name].append((time.perf_counter() - started) * 1000)
    return times


def controller_rss_kib(runtime: DockerHarness, container: str) -> int:
    """The controller's resident memory (root reads its /proc status; it is the only python of corral's)."""
    _, out = runtime.exec(container, ["ps", "-u", "corral", "-o", "rss=,args="], user="root")
    rows = [line.split(None, 1) for line in out.splitlines() if "corral.sandbox.controller" in line]
    return sum(int(rss) for rss, _ in rows)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cold", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    runtime = DockerHarness()
    instance = f"bench-kernels-{os.getpid()}"
    scratch = Path(tempfile.mkdtemp(prefix="corral-bench-kernels-"))
    try:
        with gateway_process(instance, scratch / "data") as (url, _), Sandbox.create(url=url, api_key=KEY) as sb:
            (container,) = [
                c.name for c in runtime.client.containers.list(filters={"label": f"corral.gateway={instance}"})
            ]
            _ok(sb.request({"action": {"type": "exec", "argv": ["true"]}}), "warm the launcher")
            time.sleep(2)
            rss_before = controller_rss_kib(runtime, container)
            colds = cold_starts(sb, args.cold)
            _ok(sb.request({"action": {"type": "run_code", "code": "pass"}}), "warm kernel")
            rss_with = controller_rss_kib(runtime, container)
            warm_rounds(sb, 5)
            times = warm_rounds(sb, args.rounds)
            _ok(sb.request({"action": {"type": "remove_code_context"}}), "remove")
            rss_after = controller_rss_kib(runtime, container)
    finally:
        runtime.remove_all({"corral.gateway": instance})
        runtime.remove_network(f"corral-bench-files-{os.getpid()}")
    print(f"{'run_code':<44}{'p50 ms':>10}{'p95 ms':>10}{'n':>5}")
    cold_p50, cold_max = statistics.median(colds), max(colds)
    print(f"  {'first call, cold kernel (start + cell); max':<42}{cold_p50:>10.1f}{cold_max:>10.1f}{len(colds):>5}")
    summary: dict[str, Any] = {"cold_ms": colds, "warm_ms": times}
    for name, values in times.items():
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        print(f"  {name:<42}{statistics.median(values):>10.1f}{p95:>10.1f}{len(values):>5}")
    rss = {"before any kernel": rss_before, "with one kernel": rss_with, "after its removal": rss_after}
    print("\nController RSS (MiB)")
    for name, kib in rss.items():
        print(f"  {name:<42}{kib / 1024:>10.1f}")
    summary["controller_rss_kib"] = rss
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "kernels.json").write_text(json.dumps(summary, indent=2))
    print(f"\nwrote {RESULTS / 'kernels.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
