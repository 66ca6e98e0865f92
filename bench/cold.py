"""Where a cold start's time goes, phase by phase: the gateway's steps timed in-process (network, CA,
proxy, sandbox container, the controller's secret, readiness), the sandbox's own (its boot, Xvfb,
Chromium's DevTools, the controller) from its log's Docker timestamps, and the first screenshot.

    flock /tmp/corral-bench.lock .venv/bin/python bench/cold.py --samples 5 [--before corral-desktop:latest]

A profiling aid beside bench/gateway.py's budget row: it prints each phase's start and end after the
create began (ms, medians over the samples), so what overlaps shows.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from corral.client import SandboxClient
from corral.gateway import egress as gateway_egress
from corral.gateway.server import running
from corral.gateway.settings import GatewaySettings
from corral.proxy import ca
from corral.runtime import docker as runtime_docker
from corral.runtime.docker.sandboxes import sandbox_options
from corral.runtime.types import SandboxSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"
KEY = "bench-key-Hx4Tq9Lm2Wv7Rc5Nz8Kb3Jd6Sf"  # strong enough for the gateway to hold
# The sandbox's log lines that mark its phases (boot, init, the controller), by what they say.
LOG_MARKS = {
    "boot: firewall set": re.compile(r"egress locked to the proxy"),
    "init: Xvfb ready": re.compile(r"Xvfb ready on"),
    "init: Chromium DevTools listening": re.compile(r"chromium ready: DevTools listening"),
    "controller: serving": re.compile(r"Uvicorn running on|Application startup complete"),
}


class Phases:
    """(name, start, end) in wall-clock seconds, from any thread."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()

    def add(self, name: str, start: float, end: float) -> None:
        with self._lock:
            self.spans.append((name, start, end))

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.add(name, start, time.time())

    def take(self) -> list[tuple[str, float, float]]:
        with self._lock:
            spans, self.spans = self.spans, []
        return spans


PHASES = Phases()


def timed(owner: Any, attribute: str, name: str) -> None:
    """Wrap ``owner.attribute`` (a function or a method) so each call is a span named ``name``."""
    original: Callable[..., Any] = getattr(owner, attribute)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with PHASES.span(name):
            return original(*args, **kwargs)

    setattr(owner, attribute, wrapper)


def timed_async(owner: Any, attribute: str, name: str) -> None:
    original: Callable[..., Any] = getattr(owner, attribute)

    @functools.wraps(original)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        with PHASES.span(name):
            return await original(*args, **kwargs)

    setattr(owner, attribute, wrapper)


def instrument() -> None:
    runtime = runtime_docker.DockerRuntime
    timed(runtime, "create_session_network", "gateway: session network (create + guard)")
    timed(ca, "create", "gateway: session CA")
    timed(runtime, "start_proxy", "gateway: proxy container start")
    timed(runtime, "start_sandbox", "gateway: sandbox container start (+ secret)")
    timed(runtime, "read_secret", "gateway: controller secret read (exec)")
    timed(runtime, "wait_ready", "gateway: sandbox /healthz ready")
    timed_async(gateway_egress.EgressManager, "wait_ready", "gateway: proxy control port ready")
    if hasattr(gateway_egress.EgressManager, "set_start_policy"):
        timed_async(gateway_egress.EgressManager, "set_policy", "gateway: policy set on a proxy started ahead")
    if hasattr(gateway_egress.EgressManager, "prepare_blocking"):
        timed(gateway_egress.EgressManager, "prepare_blocking", "gateway: prepare (network + CA + state)")


def docker_time(stamp: str) -> float:
    """A Docker log timestamp (RFC 3339, nanoseconds) as epoch seconds."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


def sandbox_marks(runtime: DockerHarness, container: str) -> dict[str, float]:
    marks: dict[str, float] = {}
    attrs = runtime.client.api.inspect_container(container)
    marks["docker: container started"] = docker_time(attrs["State"]["StartedAt"])
    raw: bytes = runtime.client.api.logs(container, timestamps=True)
    for line in raw.decode(errors="replace").splitlines():
        stamp, _, text = line.partition(" ")
        for name, pattern in LOG_MARKS.items():
            if name not in marks and pattern.search(text):
                marks[name] = docker_time(stamp)
    return marks


def wait_settled(http: httpx.Client, timeout_s: float = 120) -> None:
    """Until the gateway's pool and grounds are made again after the last start: a start timed beside
    their refill (a proxy booting: about a second of CPU) times two starts sharing the cores."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = http.get("/v1/health").json()
        grounds = health.get("grounds", {"held": 0, "target": 0})
        if health["sessions"]["pool"] >= health["pool_target"] and grounds["held"] >= grounds["target"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not settle: {health}")
        time.sleep(0.1)


def one_cold_start(http: httpx.Client, runtime: DockerHarness, settle_s: float = 0.0) -> dict[str, tuple[float, float]]:
    wait_settled(http)
    time.sleep(settle_s)  # a gateway that does not say when its grounds are made (an older tree's)
    PHASES.take()
    start = time.time()
    created = http.post("/v1/sessions", json={"viewport": {"width": 1280, "height": 720}}).json()
    answered = time.time()
    with SandboxClient(f"{created['ws_url']}?token={created['token']}") as sb:
        connected = time.time()
        sb.screenshot("jpeg")
    done = time.time()
    spans: dict[str, tuple[float, float]] = {}
    for name, begin, end in PHASES.take():
        spans.setdefault(name, (begin - start, end - start))
    spans["client: POST /v1/sessions answered"] = (0.0, answered - start)
    spans["client: WebSocket connected"] = (answered - start, connected - start)
    spans["client: first screenshot"] = (connected - start, done - start)
    for name, at in sandbox_marks(runtime, created["container"]).items():
        spans[name] = (at - start, at - start)
    # CPU both containers used by the first screenshot (what the start costs the machine's cores), as
    # zero-length spans at that many ms.
    for name, ident in (("cpu: sandbox", created["container"]), ("cpu: proxy", f"corral-egress-{created['id']}")):
        with contextlib.suppress(Exception):
            used = runtime.cpu_seconds(ident)
            spans[name + " (ms of CPU in 'took')"] = (0.0, used)
    http.delete(f"/v1/sessions/{created['id']}")
    return spans


def docker_floor(runtime: DockerHarness, image: str, network: str, n: int) -> dict[str, tuple[float, float]]:
    """Docker's own start, the floor under any cold start: a bare container of the sandbox's image with
    a sandbox's options (hardening, tmpfs mounts, limits, an internal network) running ``true`` instead
    of boot, from the create through run's return to its exit seen by ``wait``."""
    spec = SandboxSpec(image=image, screen="1280x720", name=f"corral-bench-floor-{os.getpid()}-{n}", network=network)
    options = {**sandbox_options(spec), "entrypoint": ["/bin/true"], "labels": {"corral.bench": "floor"}}
    start = time.time()
    container = runtime.client.containers.run(image, detach=True, **options)
    running = time.time()
    container.wait(timeout=60)
    exited = time.time()
    container.remove(force=True)
    return {
        "docker floor: bare container run (create + start)": (0.0, running - start),
        "docker floor: bare container run to its exit": (0.0, exited - start),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gateway_settings(name: str, image: str, grounds: int, ground_proxies: bool = True) -> GatewaySettings:
    return GatewaySettings(
        ground_proxies=ground_proxies,
        port=free_port(),
        preview_port=free_port(),  # gateways side by side: each its own preview listener
        data_dir=Path(tempfile.mkdtemp(prefix="corral-bench-")),
        api_key=KEY,
        instance=f"bench-cold-{name}-{os.getpid()}",
        image=image,
        pool_size=0,
        ground_pool_size=grounds,
        network=f"corral-bench-{name}-{os.getpid()}",
    )


def report(title: str, runs: list[dict[str, tuple[float, float]]]) -> dict[str, Any]:
    names = sorted({n for run in runs for n in run}, key=lambda n: statistics.median(r[n][1] for r in runs if n in r))
    print(f"{title:<52}{'start':>8}{'end':>8}{'took':>8}")
    table = {}
    for name in names:
        begins = [r[name][0] * 1000 for r in runs if name in r]
        ends = [r[name][1] * 1000 for r in runs if name in r]
        took = [(r[name][1] - r[name][0]) * 1000 for r in runs if name in r]
        row = {"start": statistics.median(begins), "end": statistics.median(ends), "took": statistics.median(took)}
        table[name] = row
        print(f"  {name:<50}{row['start']:>8.0f}{row['end']:>8.0f}{row['took']:>8.0f}")
    total = [r["client: first screenshot"][1] * 1000 for r in runs]
    print(f"\n  cold start to first screenshot: p50 {statistics.median(total):.0f} ms, max {max(total):.0f} ms\n")
    return {"phases_ms": table, "total_ms": total}


def floor_report(title: str, floors: list[dict[str, tuple[float, float]]]) -> dict[str, float]:
    print(f"{title:<52}{'p50':>8}{'max':>8}")
    table = {}
    for name in floors[0] if floors else {}:
        took = [floor[name][1] * 1000 for floor in floors]
        table[name] = statistics.median(took)
        print(f"  {name:<50}{table[name]:>8.0f}{max(took):>8.0f}")
    print()
    return table


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument(
        "--before",
        default="",
        help="an image to compare with, side by side in this run (a gateway like the other's, on that image)",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        help="a pause before each start too, for a tree whose /v1/health does not say when its grounds are made",
    )
    parser.add_argument(
        "--before-without-ground-proxies",
        action="store_true",
        help="compare with a gateway on the same image whose grounds start no proxy ahead (CORRAL_GROUND_PROXIES=0)",
    )
    args = parser.parse_args()
    instrument()
    runtime = DockerHarness()
    after = gateway_settings("after", GatewaySettings().image, GatewaySettings().ground_pool_size)
    setups = {"after": after}
    if args.before:
        # The same gateway (this tree's) and grounds: only the image differs.
        setups = {"before": gateway_settings("before", args.before, after.ground_pool_size), **setups}
    elif args.before_without_ground_proxies:
        before = gateway_settings("before", after.image, after.ground_pool_size, ground_proxies=False)
        setups = {"before": before, **setups}
    runs: dict[str, list[dict[str, tuple[float, float]]]] = {name: [] for name in setups}
    floors: list[dict[str, tuple[float, float]]] = []
    floor_network = f"corral-bench-floor-{os.getpid()}"
    runtime.client.networks.create(floor_network, driver="bridge", internal=True, labels={"corral.bench": "floor"})
    try:
        with contextlib.ExitStack() as stack:
            clients = {
                name: stack.enter_context(
                    httpx.Client(
                        base_url=stack.enter_context(running(settings)),
                        timeout=120,
                        headers={"Authorization": f"Bearer {KEY}"},
                    )
                )
                for name, settings in setups.items()
            }
            for http in clients.values():
                one_cold_start(http, runtime)  # a first start warms the page cache and Docker: not counted
            for _ in range(args.samples):  # interleaved: the machine's load falls on both alike
                for name, http in clients.items():
                    runs[name].append(one_cold_start(http, runtime, args.settle_s))
                floors.append(docker_floor(runtime, after.image, floor_network, len(floors)))
    finally:
        runtime.remove_network(floor_network)
        for settings in setups.values():
            runtime.remove_all({"corral.gateway": settings.instance})
            runtime.remove_network(settings.network)
    out = {}
    for name, settings in setups.items():
        out[name] = {
            "image": settings.image,
            "grounds": settings.ground_pool_size,
            "ground_proxies": settings.ground_proxies,
        }
        title = f"{name}: {settings.image}, grounds {settings.ground_pool_size}"
        title += f", proxies ahead {settings.ground_proxies}"
        out[name].update(report(f"{title} (ms)", runs[name]))
    out["docker_floor"] = floor_report(f"Docker's own start, {after.image}, a bare container (ms)", floors)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "cold.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
