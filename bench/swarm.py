"""The swarm driver against the single-host driver, in one run: a claim from the warm pool and a cold
start through the first screenshot on each (interleaved, so both see the same machine), their
ratios; where sessions land (sessions per node); and how long a node cut off takes to end its
session (the swarm's heartbeat, the driver's task states, the gateway's liveness).

    scripts/swarm up --images            # with CORRAL_SWARM_POOL=1 for the claim samples
    eval "$(scripts/swarm env)"          # CORRAL_URL, CORRAL_API_KEY_FILE
    flock /tmp/corral-bench.lock .venv/bin/python bench/swarm.py --samples 5 [--spread 6] [--lost]

The single-host gateway is the bench's own (bench/gateway.py's, on the host's engine, the image
CORRAL_IMAGE names); the swarm's is the one scripts/swarm started. --lost cuts a worker's link in the
swarm's LAN namespace (CORRAL_SWARM_NAME, CORRAL_SWARM_VETH) and puts it back afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tests.integration.dockerutil import DockerHarness

from gateway import bench_gateway, claim_times, cold_start_times  # bench/gateway.py

RESULTS = Path(__file__).resolve().parent / "results"
LOST_LIMIT_S = 180.0


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextlib.contextmanager
def swarm_gateway() -> Iterator[httpx.Client]:
    url = os.environ.get("CORRAL_URL", "http://127.0.0.1:8701")
    key_file = os.environ.get("CORRAL_API_KEY_FILE", "")
    if not key_file:
        raise SystemExit('CORRAL_API_KEY_FILE is not set: eval "$(scripts/swarm env)" first')
    key = Path(key_file).read_text().strip().splitlines()[0]
    with httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {key}"}) as http:
        http.get("/v1/health").raise_for_status()
        yield http


def interleaved(
    samples: int, measure: Callable[[httpx.Client, int], list[float]], single: httpx.Client, swarm: httpx.Client
) -> tuple[list[float], list[float]]:
    """One sample on each in turn, so a busy moment of the machine lands on both."""
    ones: list[float] = []
    swarms: list[float] = []
    for _ in range(samples):
        ones += measure(single, 1)
        swarms += measure(swarm, 1)
    return ones, swarms


def node_of(http: httpx.Client, session_id: str) -> str:
    """The session record's ``node``; where the gateway does not give it yet, its sandbox service's
    task's node, asked of the manager (DOCKER_HOST, as scripts/swarm env says)."""
    record = http.get(f"/v1/sessions/{session_id}").json()
    if record.get("node"):
        return str(record["node"])
    manager = docker.from_env()
    try:
        [task] = manager.api.tasks(filters={"service": record["container"], "desired-state": "running"})
        return str(manager.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"])
    finally:
        manager.close()


def spread(http: httpx.Client, count: int) -> dict[str, Any]:
    """Up to ``count`` sessions at once, then the node each reports (and the gateway's answer to the
    first it refused, if it did); all deleted afterwards."""
    created: list[dict[str, Any]] = []
    refused = ""
    try:
        for _ in range(count):
            answer = http.post("/v1/sessions", json={})
            if answer.status_code != 201 and answer.status_code != 200:
                refused = f"{answer.status_code} {answer.text[:300]}"
                break
            created.append(answer.json())
        nodes = [node_of(http, item["id"]) for item in created]
        return {"nodes": dict(Counter(nodes)), "sessions": len(created), "refused": refused}
    finally:
        for item in created:
            http.delete(f"/v1/sessions/{item['id']}")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


async def _closed(ws_url: str, token: str, cut: Callable[[], None], limit_s: float) -> tuple[float, int | None, str]:
    async with websockets.connect(f"{ws_url}?token={token}", max_size=None, open_timeout=30) as ws:
        cut()
        start = time.perf_counter()
        try:
            async with asyncio.timeout(limit_s):
                while True:
                    await ws.recv()
        except websockets.ConnectionClosed as closed:
            frame = closed.rcvd
            return time.perf_counter() - start, frame.code if frame else None, frame.reason if frame else ""
        except TimeoutError:
            return float("inf"), None, "not closed"


def lost_node(http: httpx.Client, name: str, veth: str) -> dict[str, Any]:
    """A session on a worker; that worker's link cut in the LAN namespace; the time until the
    session's WebSocket closes, and its code and reason. The link goes back up whatever happened."""
    for _ in range(6):
        created = http.post("/v1/sessions", json={}).json()
        node = node_of(http, created["id"])
        if node and not node.endswith("-1"):
            break
        http.delete(f"/v1/sessions/{created['id']}")
    else:
        raise RuntimeError("no session landed on a worker in six tries")
    index = node.rsplit("-", 1)[1]
    link = f"{veth}{index}-lan"
    try:
        seconds, code, reason = asyncio.run(
            _closed(
                created["ws_url"],
                created["token"],
                lambda: _ip("-n", f"{name}-lan", "link", "set", link, "down"),
                LOST_LIMIT_S,
            )
        )
    finally:
        _ip("-n", f"{name}-lan", "link", "set", link, "up")
        with contextlib.suppress(httpx.HTTPError):
            http.delete(f"/v1/sessions/{created['id']}")
    return {"node": node, "seconds": round(seconds, 2), "code": code, "reason": reason}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--spread", type=int, default=6, help="sessions at once for sessions per node (0: skip)")
    parser.add_argument("--lost", action="store_true", help="also time a worker cut off")
    parser.add_argument("--swarm-only", action="store_true", help="no single-host comparison: spread and lost only")
    args = parser.parse_args()
    result: dict[str, Any] = {"samples": args.samples}
    if args.swarm_only:
        with swarm_gateway() as swarm:
            return report(swarm_parts(swarm, args, result))
    with bench_gateway(DockerHarness(), max_sessions=max(4, args.spread)) as (_, single), swarm_gateway() as swarm:
        claims = interleaved(args.samples, claim_times, single, swarm)
        colds = interleaved(args.samples, cold_start_times, single, swarm)
        for name, (one, many) in (("claim_ms", claims), ("cold_start_ms", colds)):
            result[name] = {
                "single_host_p50": round(p50(one), 1),
                "swarm_p50": round(p50(many), 1),
                "ratio": round(p50(many) / p50(one), 2),
                "single_host": [round(v, 1) for v in one],
                "swarm": [round(v, 1) for v in many],
            }
        print(json.dumps(result), flush=True)  # what is measured so far, should a later part fail
        swarm_parts(swarm, args, result)
    return report(result)


def swarm_parts(swarm: httpx.Client, args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    if args.spread:
        result["sessions_per_node"] = spread(swarm, args.spread)
        print(json.dumps(result["sessions_per_node"]), flush=True)
    if args.lost:
        result["lost_node"] = lost_node(
            swarm, os.environ.get("CORRAL_SWARM_NAME", "corral-swarm"), os.environ.get("CORRAL_SWARM_VETH", "crlsw")
        )
    return result


def report(result: dict[str, Any]) -> int:
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "swarm.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
