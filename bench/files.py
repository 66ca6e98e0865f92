"""Commands and files through the gateway: ``exec`` of ``true`` over the WebSocket against ``docker exec``,
stdout streaming throughput (``head -c 200M /dev/zero``), and a 200 MiB upload and download through
the gateway's HTTP routes with the gateway's RSS growth (the gateway in a process of its own, its
VmRSS sampled every 20 ms while the bytes move).

The round trips are taken in rounds, each a few of every kind in turn (``exec``, ``cursor_position``,
``docker exec``), so that a machine whose load changes during the run weighs on all of them alike.
``--before IMAGE`` adds a second gateway (``--before-services DIR``: another tree's code for it, such
as main's) whose sandbox runs the older image, its ``exec`` taken in the same rounds: before and after
side by side, in one run.

    flock /tmp/corral-bench.lock .venv/bin/python bench/files.py \\
        [--before corral-desktop:latest --before-services ../main/services]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from corral.commands import OutputChunk
from corral.sdk import Sandbox

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for what the bench does to Docker beside the runtime
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"
KEY = "bench-key-Hx4Tq9Lm2Wv7Rc5Nz8Kb3Jd6Sf"  # strong enough for the gateway to hold
MiB = 1 << 20
SIZE = 200 * MiB
# From the Speed section.
BUDGETS = {
    "exec true p50 (ms)": ("<=", 5.0),
    "exec true vs docker exec (x faster)": (">=", 10.0),
    "stdout streaming (MB/s)": (">=", 50.0),
    "gateway RSS growth, upload (MB)": ("<=", 50.0),
    "gateway RSS growth, download (MB)": ("<=", 50.0),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@contextmanager
def gateway_process(
    instance: str, data_dir: Path, network: str, extra: dict[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """``python -m corral.gateway.server`` in a process of its own (its RSS is the gateway's alone);
    ``extra``: environment of its own (another image, another tree's code)."""
    port = free_port()
    env = {
        **os.environ,
        **(extra or {}),
        "CORRAL_PORT": str(port),
        "CORRAL_DATA_DIR": str(data_dir),
        "CORRAL_API_KEY": KEY,
        "CORRAL_INSTANCE": instance,
        "CORRAL_POOL_SIZE": "0",
        "CORRAL_EGRESS": "0",
        "CORRAL_RECORD": "0",
        "CORRAL_NETWORK": network,
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "corral.gateway.server"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start: {server.stderr.read() if server.stderr else ''}")
            time.sleep(0.2)
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(30)


def peak_growth(pid: int, work: Callable[[], None]) -> tuple[float, int]:
    """Seconds ``work`` took, and how far the process's RSS rose above where it was before."""
    before = rss_bytes(pid)
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes(pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    try:
        work()
    finally:
        elapsed = time.perf_counter() - started
        done.set()
        sampler.join()
    return elapsed, max(0, peak - before)


Measure = Callable[[int], list[float]]  # n round trips of one kind, in ms


def interleaved(kinds: dict[str, Measure], samples: dict[str, int], rounds: int) -> dict[str, list[float]]:
    """Each kind's round trips, ``samples[kind]`` in all, taken a share at a time in every round."""
    out: dict[str, list[float]] = {kind: [] for kind in kinds}
    for n in range(rounds):
        for kind, measure in kinds.items():
            share = samples[kind] * (n + 1) // rounds - samples[kind] * n // rounds
            out[kind] += measure(share)
    return out


def exec_round_trips(sb: Sandbox, samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        sb.exec(argv=["true"]).check()
        times.append((time.perf_counter() - started) * 1000)
    return times


def cursor_round_trips(sb: Sandbox, samples: int) -> list[float]:
    """The same path (client, gateway relay, controller) with no command: what ``exec`` adds is the rest."""
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        sb.cursor_position()
        times.append((time.perf_counter() - started) * 1000)
    return times


def docker_exec_round_trips(container: str, samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        subprocess.run(["docker", "exec", container, "true"], check=True, capture_output=True)
        times.append((time.perf_counter() - started) * 1000)
    return times


def stream_throughput(sb: Sandbox) -> tuple[float, int]:
    """MB/s of ``head -c 200M /dev/zero`` reaching this client as output events (base64 on the wire)."""
    received = 0
    started = time.perf_counter()
    for item in sb.exec_stream("head -c 200M /dev/zero", output_encoding="base64", timeout_ms=300_000):
        if isinstance(item, OutputChunk):
            received += len(base64.b64decode(item.data))
        else:
            item.check()
    elapsed = time.perf_counter() - started
    return received / elapsed / 1e6, received


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--docker-samples", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--before", metavar="IMAGE", help="a second sandbox of this image, its exec side by side")
    parser.add_argument("--before-services", metavar="DIR", help="the code the --before gateway runs (PYTHONPATH)")
    args = parser.parse_args()
    runtime = DockerHarness()
    instance = f"bench-files-{os.getpid()}"
    network = f"corral-bench-files-{os.getpid()}"
    scratch = Path(tempfile.mkdtemp(prefix="corral-bench-files-"))
    local = scratch / "up.bin"
    block = os.urandom(MiB)
    digest = hashlib.sha256()
    with local.open("wb") as out:
        for _ in range(SIZE // MiB):
            out.write(block)
            digest.update(block)
    results: dict[str, Any] = {}
    try:
        with contextlib.ExitStack() as stack:
            url, pid = stack.enter_context(gateway_process(instance, scratch / "data", network))
            sb = stack.enter_context(Sandbox.create(url=url, api_key=KEY))
            kinds: dict[str, Measure] = {
                "exec": lambda n: exec_round_trips(sb, n),
                "cursor": lambda n: cursor_round_trips(sb, n),
                "docker": lambda n: docker_exec_round_trips(sb.container, n),
            }
            samples = {"exec": args.samples, "cursor": args.samples, "docker": args.docker_samples}
            if args.before:
                extra = {"CORRAL_IMAGE": args.before}
                if args.before_services:
                    extra["PYTHONPATH"] = str(Path(args.before_services).resolve())
                old_url, _ = stack.enter_context(
                    gateway_process(f"{instance}-before", scratch / "before", f"{network}-before", extra)
                )
                old = stack.enter_context(Sandbox.create(url=old_url, api_key=KEY))
                old.exec(argv=["true"])
                kinds["before"] = lambda n: exec_round_trips(old, n)
                samples["before"] = args.samples
            sb.exec(argv=["true"])  # warm: the first exec connects the launcher
            taken = interleaved(kinds, samples, args.rounds)
            exec_ms, cursor_ms, docker_ms = taken["exec"], taken["cursor"], taken["docker"]
            mbps, streamed = stream_throughput(sb)
            # Warm both routes with a small file, so the growth measured is the transfer's own.
            (scratch / "small.bin").write_bytes(block)
            sb.files.upload(scratch / "small.bin", "/workspace/small.bin")
            sb.files.download("/workspace/small.bin", scratch / "small.back")
            up_s, up_growth = peak_growth(pid, lambda: sb.files.upload(local, "/workspace/big.bin"))
            local.unlink()
            back = scratch / "down.bin"
            down_s, down_growth = peak_growth(pid, lambda: sb.files.download("/workspace/big.bin", back))
            ok = hashlib.sha256(back.read_bytes()).hexdigest() == digest.hexdigest()
            back.unlink()
            results = {
                "exec_true_ms": {"p50": statistics.median(exec_ms), "p95": _p95(exec_ms), "n": len(exec_ms)},
                **(
                    {
                        "before": {
                            "image": args.before,
                            "services": args.before_services,
                            "p50": statistics.median(taken["before"]),
                            "p95": _p95(taken["before"]),
                            "n": len(taken["before"]),
                        }
                    }
                    if "before" in taken
                    else {}
                ),
                "cursor_position_ms": {
                    "p50": statistics.median(cursor_ms),
                    "p95": _p95(cursor_ms),
                    "n": len(cursor_ms),
                },
                "docker_exec_true_ms": {
                    "p50": statistics.median(docker_ms),
                    "p95": _p95(docker_ms),
                    "n": len(docker_ms),
                },
                "stdout_stream": {"bytes": streamed, "mb_per_s": mbps},
                "upload": {
                    "bytes": SIZE,
                    "seconds": up_s,
                    "mb_per_s": SIZE / up_s / 1e6,
                    "rss_growth_mb": up_growth / 1e6,
                },
                "download": {
                    "bytes": SIZE,
                    "seconds": down_s,
                    "mb_per_s": SIZE / down_s / 1e6,
                    "rss_growth_mb": down_growth / 1e6,
                    "intact": ok,
                },
            }
    finally:
        runtime.remove_all({"corral.gateway": instance})
        runtime.remove_network(network)
        if args.before:
            runtime.remove_all({"corral.gateway": f"{instance}-before"})
            runtime.remove_network(f"{network}-before")
    exec_p50, docker_p50 = results["exec_true_ms"]["p50"], results["docker_exec_true_ms"]["p50"]
    measured = {
        "exec true p50 (ms)": exec_p50,
        "exec true vs docker exec (x faster)": docker_p50 / exec_p50,
        "stdout streaming (MB/s)": results["stdout_stream"]["mb_per_s"],
        "gateway RSS growth, upload (MB)": results["upload"]["rss_growth_mb"],
        "gateway RSS growth, download (MB)": results["download"]["rss_growth_mb"],
    }
    print(f"{'Commands and files through the gateway':<44}{'p50':>10}{'p95':>10}")
    print(f"  {'exec true over the WebSocket (ms)':<42}{exec_p50:>10.2f}{results['exec_true_ms']['p95']:>10.2f}")
    cursor = results["cursor_position_ms"]
    print(f"  {'cursor_position, same path, no command (ms)':<42}{cursor['p50']:>10.2f}{cursor['p95']:>10.2f}")
    print(f"  {'docker exec SANDBOX true (ms)':<42}{docker_p50:>10.2f}{results['docker_exec_true_ms']['p95']:>10.2f}")
    if "before" in results:
        before = results["before"]
        print(f"  {'exec true, before (' + before['image'] + ')':<42}{before['p50']:>10.2f}{before['p95']:>10.2f}")
        ratio, old_x = exec_p50 / before["p50"], docker_p50 / before["p50"]
        print(f"  after/before p50: {ratio:.2f}; before vs docker exec: {old_x:.1f}x")
    print(f"\n  stdout streaming: {results['stdout_stream']['mb_per_s']:.1f} MB/s ({streamed} bytes)")
    for way in ("upload", "download"):
        r = results[way]
        growth = r["rss_growth_mb"]
        print(f"  {way} 200 MiB: {r['mb_per_s']:.1f} MB/s in {r['seconds']:.2f} s, gateway RSS +{growth:.1f} MB")
    print("\nBudgets")
    passed = results["download"]["intact"]
    for name, (op, budget) in BUDGETS.items():
        value = measured[name]
        good = value <= budget if op == "<=" else value >= budget
        passed = passed and good
        print(f"  {name:<40}{value:>9.2f}  {op} {budget:>6.1f}  {'ok' if good else 'OVER'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "files.json").write_text(json.dumps({**results, "budgets": measured}, indent=2))
    print(f"\nwrote {RESULTS / 'files.json'}")
    return 0 if passed else 1


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


if __name__ == "__main__":
    sys.exit(main())
