"""The gateway's WebSocket relay under load: what it adds to a round trip, and whether it holds up.

1. Latency: 8 sessions at once, 1,000 actions each (``cursor_position``: the controller's cheapest
   action, so the relay's share shows), each sent once through the gateway (``/v1/sessions/{id}/ws``)
   and once straight to the session's controller (its ``/v1/ws``, signed with its per-boot secret),
   interleaved pair by pair and the pair's order alternated, so both paths meet the same load. The
   added time is the side-by-side difference of the two paths' p50 (and p99).
2. Mixed traffic for ``--minutes`` (default 10): every session at once runs actions, screenshots (PNG
   and JPEG), ``exec``, files over the WebSocket and through the HTTP routes (upload and download),
   each reply checked; errors are counted and the gateway's RSS (a process of its own) is read at the
   start and end and sampled every second.

The gateway runs with no warm pool, no egress proxy and no recording: none of them is on the relay's
path, and each would add containers competing for the same 2 cores.

    .venv/bin/python bench/relay.py [--quick] [--minutes N] [--sessions N] [--actions N]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from corral.client import AsyncSandboxClient
from corral.runtime import SandboxAddress
from corral.sdk import AsyncSandbox

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for what the bench does to Docker beside the runtime
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"
KEY = "bench-key-Hx4Tq9Lm2Wv7Rc5Nz8Kb3Jd6Sf"  # strong enough for the gateway to hold
MiB = 1 << 20
CREATING_AT_ONCE = 2  # cold starts in parallel: each takes both cores for a moment
CURSOR = {"action": {"type": "cursor_position"}}
# The bound on the gateway's RSS growth over the mixed run (see growth_bound_mib's reasoning).
FRAME_MIB = 1  # corral.protocol.envelope.MAX_FRAME_BYTES: what one relayed frame can be
FILE_CHUNK_MIB = 1  # at most what the files routes hold of a transfer at once, per transfer


def growth_bound_mib(sessions: int) -> float:
    """What the gateway may keep after the mixed run beyond where it started (already warmed by the
    latency phase and one round of each kind of traffic): memory that scales with time or with the
    number of messages is a leak, so the bound is what scales with concurrency alone. Each session has
    at most one request in flight, whose reply passes the relay as one frame (<= 1 MiB, a screenshot)
    held at most twice (as websockets read it and as uvicorn writes it), or a file transfer holding a
    chunk (<= 1 MiB); the allocator may keep those pages once freed (glibc's arenas return memory
    lazily). So 3 MiB per session, plus 8 MiB for the allocator's fragmentation and the metrics'
    histograms and interpreter caches that fill in as new code paths run: 32 MiB for 8 sessions.
    A leak of 100 bytes per message over the 10 minutes' ~100k messages would be ~10 MiB on top, and
    shows as steady growth in the sampled series (printed)."""
    return sessions * (2 * FRAME_MIB + FILE_CHUNK_MIB) + 8


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
def gateway_process(instance: str, data_dir: Path, sessions: int) -> Iterator[tuple[str, int]]:
    """``python -m corral.gateway.server`` in a process of its own (its RSS is the gateway's alone)."""
    port = free_port()
    env = {
        **os.environ,
        "CORRAL_PORT": str(port),
        "CORRAL_DATA_DIR": str(data_dir),
        "CORRAL_API_KEY": KEY,
        "CORRAL_INSTANCE": instance,
        "CORRAL_POOL_SIZE": "0",
        "CORRAL_EGRESS": "0",
        "CORRAL_RECORD": "0",
        "CORRAL_MAX_SESSIONS": str(sessions),
        "CORRAL_MAX_SESSIONS_PER_KEY": str(sessions),
        "CORRAL_NETWORK": f"corral-bench-relay-{os.getpid()}",
    }
    log = data_dir.parent / "gateway.log"  # a file, not a pipe nobody reads: a full pipe would stall the gateway
    with log.open("wb") as sink:
        server = subprocess.Popen([sys.executable, "-m", "corral.gateway.server"], env=env, stdout=sink, stderr=sink)
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
                raise RuntimeError(f"the gateway did not start: {log.read_text()[-4000:]}")
            time.sleep(0.2)
        print(f"gateway at {url}, pid {server.pid} (for py-spy), its log in {log}", flush=True)
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(30)


@dataclass
class Pair:
    """One session: the SDK's sandbox (its WebSocket through the gateway) and a second WebSocket
    straight to its controller."""

    sandbox: AsyncSandbox
    direct: AsyncSandboxClient
    index: int


async def open_pairs(stack: AsyncExitStack, url: str, instance: str, count: int) -> list[Pair]:
    gate = asyncio.Semaphore(CREATING_AT_ONCE)

    async def create() -> AsyncSandbox:
        async with gate:
            return await AsyncSandbox.create(url=url, api_key=KEY)

    sandboxes = []
    for made in await asyncio.gather(*(create() for _ in range(count)), return_exceptions=True):
        if isinstance(made, AsyncSandbox):
            stack.push_async_callback(made.delete)
            sandboxes.append(made)
    if len(sandboxes) < count:
        raise RuntimeError(f"only {len(sandboxes)} of {count} sessions started")
    addresses = await asyncio.to_thread(controller_addresses, instance)
    pairs = []
    for index, sandbox in enumerate(sandboxes):
        address = addresses[sandbox.container]
        direct = AsyncSandboxClient(address.ws_url, controller_secret=address.secret)
        await stack.enter_async_context(direct)
        pairs.append(Pair(sandbox, direct, index))
    return pairs


def controller_addresses(instance: str) -> dict[str, SandboxAddress]:
    """Each sandbox's controller address and secret, by container name, as the runtime reads them."""
    listed = DockerHarness().list_sandboxes({"corral.gateway": instance})
    return {info.name: info.address for info in listed if info.address is not None}


# -- 1. latency ---------------------------------------------------------------------------------------


async def _round_trip_ms(send: Callable[[], Awaitable[dict[str, Any]]]) -> float:
    started = time.perf_counter()
    reply = await send()
    elapsed = (time.perf_counter() - started) * 1000
    if not reply.get("ok"):
        raise RuntimeError(f"cursor_position failed: {reply}")
    return elapsed


async def paired_round_trips(pair: Pair, actions: int) -> tuple[list[float], list[float]]:
    """``actions`` round trips each way, one of each per step, the first of the two alternating."""
    through: list[float] = []
    direct: list[float] = []
    via_gateway = lambda: pair.sandbox.request(CURSOR)  # noqa: E731
    straight = lambda: pair.direct.request(CURSOR)  # noqa: E731
    for step in range(actions):
        if (step + pair.index) % 2:
            through.append(await _round_trip_ms(via_gateway))
            direct.append(await _round_trip_ms(straight))
        else:
            direct.append(await _round_trip_ms(straight))
            through.append(await _round_trip_ms(via_gateway))
    return through, direct


async def latency_phase(pairs: list[Pair], actions: int) -> dict[str, Any]:
    for pair in pairs:  # warm both paths
        await paired_round_trips(pair, 20)
    started = time.perf_counter()
    runs = await asyncio.gather(*(paired_round_trips(pair, actions) for pair in pairs))
    seconds = time.perf_counter() - started
    through = [ms for run, _ in runs for ms in run]
    direct = [ms for _, run in runs for ms in run]
    differences = [t - d for run_t, run_d in runs for t, d in zip(run_t, run_d, strict=True)]
    return {
        "sessions": len(pairs),
        "actions_per_session": actions,
        "seconds": seconds,
        "gateway_ms": summary(through),
        "direct_ms": summary(direct),
        "added_p50_ms": pct(through, 0.5) - pct(direct, 0.5),
        "added_p99_ms": pct(through, 0.99) - pct(direct, 0.99),
        "paired_difference_p50_ms": pct(differences, 0.5),
    }


# -- 2. mixed traffic ---------------------------------------------------------------------------------


@dataclass
class Tally:
    done: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    first_errors: list[str] = field(default_factory=list)

    def failed(self, kind: str, why: str) -> None:
        self.errors[kind] += 1
        if len(self.first_errors) < 10:
            self.first_errors.append(f"{kind}: {why}")


class Mixed:
    """One session's share of the mixed run: each step one kind of traffic, drawn by weight, its
    reply checked."""

    def __init__(self, pair: Pair, scratch: Path, rng: random.Random) -> None:
        self.sb = pair.sandbox
        self.scratch = scratch
        self.rng = rng
        self.blob = rng.randbytes(256 * 1024)
        self.local = scratch / f"up-{pair.index}.bin"
        self.local.write_bytes(self.blob)
        self.kinds: dict[str, tuple[int, Callable[[], Awaitable[None]]]] = {
            "action": (10, self.action),
            "screenshot png": (2, self.screenshot_png),
            "screenshot jpeg": (2, self.screenshot_jpeg),
            "exec": (3, self.exec),
            "file over ws": (2, self.file_ws),
            "file over http": (1, self.file_http),
        }

    async def action(self) -> None:
        x, y = self.rng.randrange(1280), self.rng.randrange(800)
        await self.sb.act({"type": "move", "x": x, "y": y})
        if await self.sb.cursor_position() != (x, y):
            raise AssertionError(f"the pointer is not at {(x, y)}")

    async def screenshot_png(self) -> None:
        if not (await self.sb.screenshot("png")).startswith(b"\x89PNG"):
            raise AssertionError("not a PNG")

    async def screenshot_jpeg(self) -> None:
        if not (await self.sb.screenshot("jpeg")).startswith(b"\xff\xd8"):
            raise AssertionError("not a JPEG")

    async def exec(self) -> None:
        word = f"w{self.rng.randrange(1 << 30)}"
        result = await self.sb.exec(argv=["echo", word])
        if result.exit_code != 0 or result.stdout.strip() != word:
            raise AssertionError(f"exec echoed {result.stdout!r}, exit {result.exit_code}")

    async def file_ws(self) -> None:
        data = self.rng.randbytes(self.rng.randrange(1, 64 * 1024))
        await self.sb.files.write("/workspace/ws.bin", data)
        if await self.sb.files.read("/workspace/ws.bin") != data:
            raise AssertionError("file read back differs")

    async def file_http(self) -> None:
        await self.sb.files.upload(self.local, "/workspace/http.bin")
        back = await self.sb.files.download("/workspace/http.bin", self.scratch / f"{self.local.name}.back")
        if hashlib.sha256(back.read_bytes()).digest() != hashlib.sha256(self.blob).digest():
            raise AssertionError("download differs from upload")

    async def one_of_each(self, tally: Tally) -> None:
        for kind, (_, run) in self.kinds.items():
            await self.step(kind, run, tally)

    async def run_until(self, deadline: float, tally: Tally) -> None:
        names = list(self.kinds)
        weights = [weight for weight, _ in self.kinds.values()]
        while time.monotonic() < deadline:
            kind = self.rng.choices(names, weights)[0]
            await self.step(kind, self.kinds[kind][1], tally)

    @staticmethod
    async def step(kind: str, run: Callable[[], Awaitable[None]], tally: Tally) -> None:
        try:
            await run()
        except Exception as exc:  # counted, and the run goes on
            tally.failed(kind, f"{type(exc).__name__}: {exc}")
        else:
            tally.done[kind] += 1


async def sample_rss(pid: int, every_s: float, into: list[tuple[float, int]], stop: asyncio.Event) -> None:
    started = time.monotonic()
    while not stop.is_set():
        into.append((time.monotonic() - started, rss_bytes(pid)))
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def mixed_phase(pairs: list[Pair], pid: int, minutes: float, scratch: Path) -> dict[str, Any]:
    rng = random.Random(16)
    sessions = [Mixed(pair, scratch, random.Random(rng.randrange(1 << 30))) for pair in pairs]
    warm = Tally()
    await asyncio.gather(*(mixed.one_of_each(warm) for mixed in sessions))  # every path run once before "start"
    tally = Tally(errors=warm.errors.copy(), first_errors=list(warm.first_errors))
    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()
    start_rss = rss_bytes(pid)
    sampler = asyncio.create_task(sample_rss(pid, 1.0, samples, stop))
    deadline = time.monotonic() + minutes * 60
    started = time.perf_counter()
    try:
        await asyncio.gather(*(mixed.run_until(deadline, tally) for mixed in sessions))
    finally:
        stop.set()
        await sampler
    seconds = time.perf_counter() - started
    end_rss = rss_bytes(pid)
    return {
        "minutes": minutes,
        "seconds": seconds,
        "sessions": len(pairs),
        "requests": dict(tally.done),
        "requests_total": sum(tally.done.values()),
        "errors": dict(tally.errors),
        "errors_total": sum(tally.errors.values()),
        "first_errors": tally.first_errors,
        "rss_start_mib": start_rss / MiB,
        "rss_end_mib": end_rss / MiB,
        "rss_peak_mib": max(rss for _, rss in samples) / MiB if samples else end_rss / MiB,
        "rss_growth_mib": (end_rss - start_rss) / MiB,
        "rss_by_minute_mib": [round(rss / MiB, 1) for t, rss in samples if int(t) % 60 == 0],
    }


async def gateway_errors(url: str) -> Counter[str]:
    """The gateway's own count of error replies and refusals (``corral_errors_total``), by code: a
    checked miss (``file_stat`` of an upload's target before it exists) counts there too."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("corral_errors_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels.partition('code="')[2].partition('"')[0]] += round(float(value))
    return counts


# -- the run ------------------------------------------------------------------------------------------


async def run(url: str, pid: int, instance: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        pairs = await open_pairs(stack, url, instance, args.sessions)
        errors_before = await gateway_errors(url)
        latency = await latency_phase(pairs, args.actions)
        mixed = await mixed_phase(pairs, pid, args.minutes, scratch)
        mixed["gateway_errors_by_code"] = dict(await gateway_errors(url) - errors_before)
        return {"latency": latency, "mixed": mixed}


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": pct(values, 0.5), "p99": pct(values, 0.99), "mean": statistics.fmean(values), "n": len(values)}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(results: dict[str, Any], bound_mib: float) -> bool:
    latency, mixed = results["latency"], results["mixed"]
    through, direct = latency["gateway_ms"], latency["direct_ms"]
    print(f"Gateway relay: {latency['sessions']} sessions x {latency['actions_per_session']} cursor_position each way")
    print(f"  {'':<34}{'p50':>9}{'p99':>9}{'mean':>9}")
    print(f"  {'through the gateway (ms)':<34}{through['p50']:>9.3f}{through['p99']:>9.3f}{through['mean']:>9.3f}")
    print(f"  {'straight to the controller (ms)':<34}{direct['p50']:>9.3f}{direct['p99']:>9.3f}{direct['mean']:>9.3f}")
    print(
        f"  {'added by the relay (ms)':<34}{latency['added_p50_ms']:>9.3f}{latency['added_p99_ms']:>9.3f}"
        f"   (median of paired differences {latency['paired_difference_p50_ms']:.3f} ms)"
    )
    print(f"\nMixed traffic: {mixed['sessions']} sessions at once for {mixed['seconds'] / 60:.1f} min")
    for kind, count in sorted(mixed["requests"].items()):
        print(f"  {kind:<20}{count:>8}  errors {mixed['errors'].get(kind, 0)}")
    print(f"  gateway's corral_errors_total over the run, by code: {mixed['gateway_errors_by_code']}")
    print(
        f"  gateway RSS: {mixed['rss_start_mib']:.1f} MiB at start, {mixed['rss_end_mib']:.1f} at end, "
        f"{mixed['rss_peak_mib']:.1f} peak; by minute {mixed['rss_by_minute_mib']}"
    )
    for line in mixed["first_errors"]:
        print(f"  error: {line}")
    rows = [
        ("gateway relay added p50", latency["added_p50_ms"], "ms", "<=", 0.5),
        ("gateway RSS growth over the mixed run", mixed["rss_growth_mib"], "MiB", "<=", bound_mib),
        ("errors", float(mixed["errors_total"]), "", "<=", 0.0),
    ]
    print("\nBudgets")
    passed = True
    for name, value, unit, op, budget in rows:
        good = value <= budget if op == "<=" else value >= budget
        passed = passed and good
        print(f"  {name:<40}{value:>9.3f} {unit:<4} {op} {budget:>7.1f} {unit:<4} {'ok' if good else 'OVER'}")
    print(f"  {'gateway relay added p99 (stated)':<40}{latency['added_p99_ms']:>9.3f} ms")
    return passed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--actions", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="1 minute of mixed traffic instead of --minutes")
    args = parser.parse_args()
    if args.quick:
        args.minutes = 1.0
    instance = f"bench-relay-{os.getpid()}"
    scratch = Path(tempfile.mkdtemp(prefix="corral-bench-relay-"))
    runtime = DockerHarness()
    try:
        with gateway_process(instance, scratch / "data", args.sessions) as (url, pid):
            results = asyncio.run(run(url, pid, instance, args, scratch))
    finally:
        runtime.remove_all({"corral.gateway": instance})
        runtime.remove_network(f"corral-bench-relay-{os.getpid()}")
    bound = growth_bound_mib(args.sessions)
    passed = report(results, bound)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "relay.json").write_text(json.dumps({**results, "rss_growth_bound_mib": bound}, indent=2))
    print(f"\nwrote {RESULTS / 'relay.json'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
