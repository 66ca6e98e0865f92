"""Live view benchmark: screen change to pixels at a viewer, the sandbox's CPU with and without a stream
(an idle screen and a busy one), and an agent action's latency with a stream attached against without.

Change to pixels is measured twice, from just before the agent's click that repaints the page: to
the first frame showing the new colour at the controller's stream (WS /v1/live), and to the viewer
page's canvas showing it in a real Chromium on this host, through a real gateway and a view link (the
issue's budget is on the latter: what a person sees).

    scripts/bench   (or: python bench/live.py [--samples N])
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
from PIL import Image

from corral import images
from corral.client import AsyncSandboxClient
from corral.gateway.controller import connect_ws
from corral.gateway.server import running
from corral.gateway.settings import GatewaySettings
from corral.runtime import SandboxAddress, SandboxSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for what the bench does to Docker beside the runtime
from tests.integration.dockerutil import DockerHarness


class EventLike(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...


RESULTS = Path(__file__).resolve().parent / "results"
VIEWER = "human:lnk_bench0live00"
CPU_WINDOW_S = 10.0

# Budgets from the issue (design15.md), on a 2-core machine. Never loosened.
CHANGE_TO_PIXELS_P50_MS = 150.0
ACTION_SLOWDOWN_MAX = 1.10  # an agent action's p50 with a stream attached, over its p50 without

COLOURS = [(220, 30, 30), (30, 160, 30), (30, 30, 220), (200, 160, 20)]
# A full-page colour that the agent's click flips to the next one (read back from the frames' centre).
FLIP_PAGE = """<!doctype html><meta charset=utf-8><title>flip</title>
<body style="margin:0;height:100vh;background:rgb(220,30,30)">
<script>
const colours = COLOURS; let i = 0;
document.addEventListener('click', () => { i = (i + 1) % colours.length;
  document.body.style.background = 'rgb(' + colours[i].join(',') + ')'; });
</script>""".replace("COLOURS", json.dumps(COLOURS))
STILL_PAGE = "<!doctype html><meta charset=utf-8><title>still</title><body style='margin:0'><h1>Nothing moves</h1>"
# A busy screen: a large block sliding and a counter redrawn every frame.
BUSY_PAGE = """<!doctype html><meta charset=utf-8><title>busy</title>
<style>body{margin:0} #b{position:absolute;top:100px;width:300px;height:300px;background:#36c;
animation:slide 2s linear infinite alternate} @keyframes slide{from{left:0}to{left:900px}}</style>
<div id=b></div><h1 id=n style="position:absolute;top:450px;left:20px">0</h1>
<script>let n = 0; (function tick(){ document.getElementById('n').textContent = ++n; requestAnimationFrame(tick); })();
</script>"""


def data_url(page: str) -> str:
    return "data:text/html;charset=utf-8," + urllib.parse.quote(page)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(name: str, values: list[float]) -> dict[str, Any]:
    return {
        "name": name,
        "p50_ms": round(statistics.median(values), 2),
        "p90_ms": round(pct(values, 0.90), 2),
        "n": len(values),
    }


def close_to(rgb: tuple[int, int, int], want: tuple[int, int, int], tolerance: int = 24) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(rgb, want, strict=True))


class LiveStream:
    """The controller's live stream, as the gateway opens it; frames counted as they come."""

    def __init__(self, sandbox: SandboxAddress) -> None:
        self._url = f"ws://{sandbox.host}:{sandbox.port}/v1/live?viewer={VIEWER}&mode=view"
        self._secret = sandbox.secret
        self.frames = 0
        self.bytes = 0
        self._newest: tuple[float, bytes] | None = None
        self._arrived = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LiveStream:
        self._ws = await connect_ws(self._url, self._secret)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._reader is not None
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()

    async def _read(self) -> None:
        async for message in self._ws:
            if isinstance(message, bytes):
                self.frames += 1
                self.bytes += len(message)
                self._newest = (time.perf_counter(), message)
                self._arrived.set()

    async def frame_showing(self, colour: tuple[int, int, int], timeout_s: float = 5.0) -> float:
        """When (perf_counter) the first frame showing ``colour`` at its centre arrived."""
        async with asyncio.timeout(timeout_s):
            while True:
                await self._arrived.wait()
                self._arrived.clear()
                assert self._newest is not None
                at, jpeg = self._newest
                image = Image.open(io.BytesIO(jpeg)).convert("RGB")
                centre = image.getpixel((image.width // 2, image.height // 2))
                assert isinstance(centre, tuple)
                if close_to((centre[0], centre[1], centre[2]), colour):
                    return at


def _read_stream(sandbox: SandboxAddress, stop: EventLike, opened: EventLike, frames: Any) -> None:
    """The viewer's process: reads the stream until ``stop``, counting frames into ``frames``."""

    async def read() -> None:
        async with LiveStream(sandbox) as stream:
            opened.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
                frames.value = stream.frames

    asyncio.run(read())


class ViewerElsewhere:
    """A stream read by another process, as a real viewer reads it: receiving frames must not slow
    the agent's client, which this bench times (a thread of this process took the client's GIL for
    ~0.2 ms a click, about a tenth of a click's 2 ms: the bench measured itself)."""

    def __init__(self, sandbox: SandboxAddress) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._opened = context.Event()
        self._frames = context.Value("i", 0)
        self._process = context.Process(
            target=_read_stream, args=(sandbox, self._stop, self._opened, self._frames), name="bench-viewer"
        )

    @property
    def frames(self) -> int:
        return int(self._frames.value)

    def __enter__(self) -> ViewerElsewhere:
        self._process.start()
        if not self._opened.wait(30):
            self._process.kill()
            raise RuntimeError("the live stream did not open")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


async def change_to_pixels_at_stream(agent: AsyncSandboxClient, sandbox: SandboxAddress, samples: int) -> list[float]:
    """The agent's click flips the page's colour; the time until the stream's frame shows it."""
    await agent.act({"type": "navigate", "url": data_url(FLIP_PAGE)})
    out: list[float] = []
    async with LiveStream(sandbox) as stream:
        await stream.frame_showing(COLOURS[0])
        for i in range(1, samples + 1):
            colour = COLOURS[i % len(COLOURS)]
            start = time.perf_counter()
            await agent.act({"type": "click", "x": 640, "y": 400})
            out.append((await stream.frame_showing(colour) - start) * 1000)
            await asyncio.sleep(0.2)  # a pause between changes, as a person's or an agent's
    return out


async def change_to_pixels_in_viewer(
    viewer_url: str, change: Callable[[tuple[int, int, int]], Awaitable[None]], samples: int
) -> list[float]:
    """Screen change to pixels in a real Chromium showing the viewer page at ``viewer_url`` (a viewer
    link's URL): ``change(colour)`` makes the sandbox's page show ``colour`` (the agent's click on
    :data:`FLIP_PAGE`); the time until the viewer's canvas shows it at its centre, read in the page at
    each animation frame."""
    from playwright.async_api import async_playwright

    probe = """([r, g, b]) => { const c = document.querySelector('canvas'); if (!c || !c.width) return false;
      const p = c.getContext('2d').getImageData(c.width >> 1, c.height >> 1, 1, 1).data;
      return Math.abs(p[0] - r) < 24 && Math.abs(p[1] - g) < 24 && Math.abs(p[2] - b) < 24; }"""
    out: list[float] = []
    async with async_playwright() as p:
        # Debian's Chromium, as the integration tests use (scripts/test installs it).
        chromium = shutil.which("chromium") or "/usr/bin/chromium"
        browser = await p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            await page.goto(viewer_url)
            await page.wait_for_function(probe, arg=list(COLOURS[0]), polling="raf", timeout=15_000)
            for i in range(1, samples + 1):
                colour = COLOURS[i % len(COLOURS)]
                start = time.perf_counter()
                await change(colour)
                await page.wait_for_function(probe, arg=list(colour), polling="raf", timeout=5_000)
                out.append((time.perf_counter() - start) * 1000)
                await asyncio.sleep(0.2)
        finally:
            await browser.close()
    return out


async def cpu_percent(runtime: DockerHarness, sandbox: SandboxAddress) -> float:
    """The sandbox container's CPU over :data:`CPU_WINDOW_S` (docker stats' counter; 100 = one core)."""
    before = await asyncio.to_thread(runtime.cpu_seconds, sandbox.id)
    start = time.monotonic()
    await asyncio.sleep(CPU_WINDOW_S)
    after = await asyncio.to_thread(runtime.cpu_seconds, sandbox.id)
    return round((after - before) / (time.monotonic() - start) * 100, 1)


async def cpu_by_case(runtime: DockerHarness, sandbox: SandboxAddress, agent: AsyncSandboxClient) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for screen, page in (("idle", STILL_PAGE), ("busy", BUSY_PAGE)):
        await agent.act({"type": "navigate", "url": data_url(page)})
        await asyncio.sleep(1.0)
        out[f"{screen} screen, no stream"] = {"cpu_pct": await cpu_percent(runtime, sandbox)}
        async with LiveStream(sandbox) as stream:
            await asyncio.sleep(1.0)
            frames = stream.frames
            cpu = await cpu_percent(runtime, sandbox)
            fps = (stream.frames - frames) / CPU_WINDOW_S
        out[f"{screen} screen, one stream"] = {"cpu_pct": cpu, "fps": round(fps, 1)}
    return out


async def action_latency(
    agent: AsyncSandboxClient, sandbox: SandboxAddress, rounds: int, per_round: int
) -> dict[str, list[float]]:
    """Screenshot and click latency without a stream and with one, interleaved round by round (the
    click flips the page's colour, so the stream has frames to encode meanwhile)."""
    await agent.act({"type": "navigate", "url": data_url(FLIP_PAGE)})
    out: dict[str, list[float]] = {f"{k} {w}": [] for k in ("screenshot", "click") for w in ("without", "with")}

    async def block(which: str) -> None:
        for _ in range(per_round):
            start = time.perf_counter()
            await agent.act({"type": "screenshot"})
            out[f"screenshot {which}"].append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            await agent.act({"type": "click", "x": 640, "y": 400})
            out[f"click {which}"].append((time.perf_counter() - start) * 1000)
            await asyncio.sleep(0.05)

    for index in range(rounds):
        order = ("without", "with") if index % 2 == 0 else ("with", "without")
        for which in order:
            if which == "with":
                with ViewerElsewhere(sandbox) as viewer:
                    await asyncio.sleep(0.3)  # its first frame sent
                    await block(which)
                    assert viewer.frames > 0
            else:
                await block(which)
    return out


KEY = "bench-live-key-Pw6Yt3Mk8Zr1Qh5Vd9Lc2Nx"  # strong enough for the gateway to hold


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def change_to_pixels_through_gateway(runtime: DockerHarness, samples: int) -> list[float]:
    """:func:`change_to_pixels_in_viewer` against a real gateway (egress on, as it ships): a session,
    a view link, its viewer page in Chromium; the agent's clicks over the gateway's WebSocket."""
    instance = f"bench-live-{os.getpid()}"
    settings = GatewaySettings(
        port=_free_port(),
        preview_port=_free_port(),  # not 8701: a gateway already running holds it
        data_dir=Path(tempfile.mkdtemp(prefix="corral-bench-live-")),
        api_key=KEY,
        instance=instance,
        pool_size=0,
        network=f"corral-bench-live-{os.getpid()}",
    )
    try:
        with (
            running(settings) as url,
            httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as http,
        ):
            created = http.post("/v1/sessions", json={}).raise_for_status().json()
            link = http.post(f"/v1/sessions/{created['id']}/links", json={"mode": "view", "ttl_s": 900})
            agent_url = f"{created['ws_url']}?token={created['token']}"
            return asyncio.run(_clicks_seen_in_viewer(agent_url, link.raise_for_status().json()["url"], samples))
    finally:
        runtime.remove_all({"corral.gateway": instance})
        runtime.remove_network(settings.network)


async def _clicks_seen_in_viewer(agent_url: str, viewer_url: str, samples: int) -> list[float]:
    async with AsyncSandboxClient(agent_url) as agent:
        await agent.act({"type": "navigate", "url": data_url(FLIP_PAGE)})

        async def click(_: tuple[int, int, int]) -> None:
            await agent.act({"type": "click", "x": 640, "y": 400})

        return await change_to_pixels_in_viewer(viewer_url, click, samples)


async def measure(runtime: DockerHarness, sandbox: SandboxAddress, samples: int, rounds: int) -> dict[str, Any]:
    async with AsyncSandboxClient(sandbox.ws_url, controller_secret=sandbox.secret) as agent:
        change = await change_to_pixels_at_stream(agent, sandbox, samples)
        latency = await action_latency(agent, sandbox, rounds, per_round=6)
        cpu = await cpu_by_case(runtime, sandbox, agent)
    return {"change": change, "latency": latency, "cpu": cpu}


def report(measured: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    at_stream = row("agent click -> frame at the controller's stream", measured["change"])
    change = row("agent click -> pixels in the viewer page (gateway)", measured["viewer"])
    latency = {name: row(name, values) for name, values in measured["latency"].items()}
    slowdown = {
        kind: latency[f"{kind} with"]["p50_ms"] / latency[f"{kind} without"]["p50_ms"]
        for kind in ("screenshot", "click")
    }
    budgets = {
        "change to pixels p50": {
            "budget_ms": CHANGE_TO_PIXELS_P50_MS,
            "p50_ms": change["p50_ms"],
            "ok": change["p50_ms"] <= CHANGE_TO_PIXELS_P50_MS,
        },
        **{
            f"{kind} with a stream / without": {
                "budget": ACTION_SLOWDOWN_MAX,
                "ratio": round(ratio, 3),
                "ok": ratio <= ACTION_SLOWDOWN_MAX,
            }
            for kind, ratio in slowdown.items()
        },
    }
    print(f"{'Screen change to pixels':<52}{'p50 ms':>10}{'p90 ms':>10}{'n':>6}")
    for r in (at_stream, change):
        print(f"  {r['name']:<50}{r['p50_ms']:>10.1f}{r['p90_ms']:>10.1f}{r['n']:>6}")
    print(f"\n{'Agent action latency (interleaved, same run)':<52}{'p50 ms':>10}{'p90 ms':>10}{'n':>6}")
    for r in latency.values():
        print(f"  {r['name']:<50}{r['p50_ms']:>10.2f}{r['p90_ms']:>10.2f}{r['n']:>6}")
    print(f"\n{'Sandbox CPU over ' + str(int(CPU_WINDOW_S)) + ' s (100% = one core)':<52}{'cpu %':>10}{'fps':>10}")
    for name, value in measured["cpu"].items():
        fps = f"{value['fps']:>10.1f}" if "fps" in value else f"{'-':>10}"
        print(f"  {name:<50}{value['cpu_pct']:>10.1f}{fps}")
    print("\nBudgets")
    for name, b in budgets.items():
        timed = "p50_ms" in b
        shown = f"{b['p50_ms']:.1f} ms <= {b['budget_ms']:.0f} ms" if timed else f"{b['ratio']:.3f} <= {b['budget']}"
        print(f"  {name:<40} {shown:<24} {'ok' if b['ok'] else 'OVER'}")
    out = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "change_to_pixels": change,
        "change_to_frame_at_stream": at_stream,
        "action_latency": list(latency.values()),
        "cpu": measured["cpu"],
        "budgets": budgets,
    }
    return out, all(b["ok"] for b in budgets.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    runtime = DockerHarness()
    sandbox = runtime.start_sandbox(SandboxSpec(image=images.DESKTOP_IMAGE, name=f"corral-bench-live-{os.getpid()}"))
    try:
        runtime.wait_ready(sandbox)
        measured = asyncio.run(measure(runtime, sandbox, args.samples, args.rounds))
    finally:
        runtime.remove(sandbox.id)
    measured["viewer"] = change_to_pixels_through_gateway(runtime, args.samples)
    out, ok = report(measured)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "live.json").write_text(json.dumps(out, indent=2))
    print(f"\nwrote {RESULTS / 'live.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
