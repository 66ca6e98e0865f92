"""Corral's speed benchmark: per-action round trips over the WebSocket against the real image.

In the same run it measures what reference implementations do (one ``xdotool`` subprocess per
action, one ``scrot`` per screenshot, a fixed 2 s sleep before the post-action screenshot) inside
the same container, and prints the ratios. Prints a table and writes bench/results/latest.json.

    scripts/bench [--samples N]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from corral import images
from corral.client import SandboxClient, image_bytes
from corral.runtime import SandboxAddress, SandboxSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for what the bench does to Docker beside the runtime
from tests.integration.dockerutil import DockerHarness

RESULTS = Path(__file__).resolve().parent / "results"

# Budgets from the issue, on a 2-core machine.
BUDGETS_MS = {"click": 5.0, "screenshot jpeg": 10.0, "screenshot png": 35.0}
# Issue 16: a PNG screenshot at least twice as fast as scrot's, and no bigger, on every screen below.
PNG_SPEED_RATIO_MIN = 2.0  # scrot p50 / corral p50
PNG_SIZE_RATIO_MAX = 1.0  # corral bytes / scrot bytes

PAGE = """<!doctype html><meta charset=utf-8><title>bench</title>
<textarea id=t style="position:absolute;left:20px;top:20px;width:600px;height:300px"></textarea>
<button id=b style="position:absolute;left:700px;top:20px;width:200px;height:80px;background:#f00;border:0">go</button>
<div id=out style="position:absolute;left:20px;top:360px;font:24px sans-serif"></div>
<script>
document.getElementById('b').addEventListener('click', async () => {
  // What a real page does on a click: a request, some work, then render (a blue block marks "done").
  await fetch('http://127.0.0.1:8765/healthz', {mode: 'no-cors', cache: 'no-store'}).catch(() => {});
  setTimeout(() => { const out = document.getElementById('out'); out.innerHTML = '';
    for (let i = 0; i < 5; i++) { const p = document.createElement('p'); p.textContent = 'row ' + i;
      out.appendChild(p); }
    out.insertAdjacentHTML('beforeend', '<div style="width:200px;height:40px;background:#00f"></div>');
  }, 150);
});
</script>"""

# Runs inside the sandbox: the reference approach, one subprocess per action.
BASELINE = r"""
import json, subprocess, sys, time
n = int(sys.argv[1])
def timed(argv):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out.append((time.perf_counter() - t) * 1000)
    return out
print(json.dumps({
    "xdotool click": timed(["xdotool", "mousemove", "900", "700", "click", "1"]),
    "xdotool key": timed(["xdotool", "key", "shift"]),
    "xdotool type 20 chars": timed(["xdotool", "type", "--delay", "0", "abcdefghijklmnopqrst"]),
    "scrot png": timed(["scrot", "-o", "/tmp/bench-scrot.png"]),
}))
"""


# Realistic screens for PNG speed and size: a text page (an article) and a photo-like one (smooth
# colour fields with grain, drawn on a canvas from a fixed seed, so every run shows the same pixels).
TEXT_PAGE = (
    "<!doctype html><meta charset=utf-8><title>Article</title>"
    "<body style='font:16px serif;margin:40px;max-width:900px'>"
    + "".join(
        f"<h2>Section {i}</h2><p>"
        + "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore "
        "et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation <a href=#>ullamco "
        "laboris</a> nisi ut aliquip ex ea commodo consequat. "
        * 3
        + "</p><ul><li>First item with <code>code()</code></li><li>Second item</li></ul>"
        for i in range(12)
    )
)
PHOTO_PAGE = """<!doctype html><meta charset=utf-8><title>Photo</title><body style=margin:0>
<canvas id=c width=1280 height=800></canvas><script>
const c = document.getElementById('c').getContext('2d'), im = c.createImageData(1280, 800);
let s = 12345; const r = () => (s = (s * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
const clamp = v => Math.max(0, Math.min(255, v));
for (let y = 0; y < 800; y++) for (let x = 0; x < 1280; x++) {
  const i = (y * 1280 + x) * 4, v = Math.sin(x / 97) * Math.cos(y / 61) * 60 + Math.sin((x + y) / 23) * 20;
  im.data[i] = clamp(120 + v + x / 12 + (r() - .5) * 24);
  im.data[i + 1] = clamp(100 + v * 0.8 + y / 10 + (r() - .5) * 24);
  im.data[i + 2] = clamp(90 - v * 0.5 + (x + y) / 30 + (r() - .5) * 24);
  im.data[i + 3] = 255;
}
c.putImageData(im, 0, 0); c.filter = 'blur(1.5px)'; c.drawImage(c.canvas, 0, 0);
</script>"""

# Runs inside the sandbox: scrot on the screen as it is, its times and the size of its PNG.
SCROT = r"""
import json, os, subprocess, sys, time
out = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    subprocess.run(["scrot", "-o", "/tmp/bench-scrot.png"], check=True)
    out.append((time.perf_counter() - t) * 1000)
print(json.dumps({"ms": out, "bytes": os.path.getsize("/tmp/bench-scrot.png")}))
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(samples: int, fn: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def measure_corral(client: SandboxClient, samples: int) -> dict[str, list[float]]:
    client.act({"type": "navigate", "url": "data:text/html;charset=utf-8," + urllib.parse.quote(PAGE)})
    client.act({"type": "click", "x": 300, "y": 150})  # focus the textarea
    results: dict[str, list[float]] = {}
    results["move"] = timed(samples, lambda: client.act({"type": "move", "x": 640, "y": 500}))
    results["click"] = timed(samples, lambda: client.act({"type": "click", "x": 300, "y": 150}))
    results["key"] = timed(samples, lambda: client.act({"type": "key", "keys": "shift"}))
    results["type 20 chars"] = timed(samples, lambda: client.act({"type": "type", "text": "abcdefghijklmnopqrst"}))
    for fmt in ("png", "jpeg", "webp"):
        results[f"screenshot {fmt}"] = timed(samples, lambda fmt=fmt: client.act({"type": "screenshot", "format": fmt}))
    return results


def _rendered(reply: dict[str, Any]) -> bool:
    """Whether the screenshot shows the page's final state (its blue block)."""
    image = Image.open(io.BytesIO(base64.b64decode(reply["screenshot"]["data"]))).convert("RGB")
    return any(color == (0, 0, 255) for _, color in image.getcolors(1 << 20) or [])


def measure_settle(client: SandboxClient, samples: int) -> tuple[list[float], list[float], int, int]:
    """Click a button whose page fetches, then re-renders 150 ms later: settled shot vs sleep(2) + shot."""
    url = "data:text/html;charset=utf-8," + urllib.parse.quote(PAGE)
    settled, fixed, correct, fixed_correct = [], [], 0, 0
    for _ in range(samples):
        client.act({"type": "navigate", "url": url})
        start = time.perf_counter()
        reply = client.act({"type": "click", "x": 800, "y": 150}, screenshot=True, wait_for="stable")
        settled.append((time.perf_counter() - start) * 1000)
        correct += _rendered(reply)
        client.act({"type": "navigate", "url": url})
        start = time.perf_counter()
        client.act({"type": "click", "x": 800, "y": 150})
        time.sleep(2.0)  # the reference demo's fixed delay
        shot = client.act({"type": "screenshot"})
        fixed.append((time.perf_counter() - start) * 1000)
        fixed_correct += _rendered(shot)
    return settled, fixed, correct, fixed_correct


def baseline(runtime: DockerHarness, sandbox: SandboxAddress, samples: int) -> dict[str, list[float]]:
    code, out = runtime.exec(sandbox.id, ["python", "-I", "-c", BASELINE, str(samples)])
    if code != 0:
        raise RuntimeError(f"baseline failed: {out}")
    data: dict[str, list[float]] = json.loads(out.strip().splitlines()[-1])
    return data


def measure_png_vs_scrot(
    client: SandboxClient, runtime: DockerHarness, sandbox: SandboxAddress, samples: int
) -> list[dict[str, Any]]:
    """Per screen, in one run: corral's PNG screenshots and scrot's of the same pixels, times and bytes."""
    out = []
    for name, page in (("bench page", PAGE), ("text page", TEXT_PAGE), ("photo-like page", PHOTO_PAGE)):
        client.act({"type": "navigate", "url": "data:text/html;charset=utf-8," + urllib.parse.quote(page)})
        client.act({"type": "move", "x": 1279, "y": 799}, screenshot=True, wait_for="stable")  # drawn, pointer aside
        ours = timed(samples, lambda: client.act({"type": "screenshot", "format": "png"}))
        size = len(image_bytes(client.act({"type": "screenshot", "format": "png"})))
        code, text = runtime.exec(sandbox.id, ["python", "-I", "-c", SCROT, str(samples)])
        if code != 0:
            raise RuntimeError(f"scrot failed: {text}")
        scrot = json.loads(text.strip().splitlines()[-1])
        corral_ms, scrot_ms = statistics.median(ours), statistics.median(scrot["ms"])
        out.append(
            {
                "screen": name,
                "corral_p50_ms": round(corral_ms, 2),
                "scrot_p50_ms": round(scrot_ms, 2),
                "corral_bytes": size,
                "scrot_bytes": scrot["bytes"],
                "speed_ratio": round(scrot_ms / corral_ms, 2),
                "size_ratio": round(size / scrot["bytes"], 3),
            }
        )
    return out


def row(name: str, values: list[float]) -> dict[str, Any]:
    return {
        "name": name,
        "p50_ms": round(statistics.median(values), 2),
        "p95_ms": round(pct(values, 0.95), 2),
        "n": len(values),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--settle-samples", type=int, default=5)
    parser.add_argument("--baseline-samples", type=int, default=20)
    parser.add_argument("--png-samples", type=int, default=20, help="per screen, corral's and scrot's")
    args = parser.parse_args()

    runtime = DockerHarness()
    name = f"corral-bench-{os.getpid()}"
    sandbox = runtime.start_sandbox(SandboxSpec(image=images.DESKTOP_IMAGE, name=name))
    try:
        ready_s = runtime.wait_ready(sandbox)
        with SandboxClient(sandbox.ws_url, controller_secret=sandbox.secret) as client:
            ours = measure_corral(client, args.samples)
            png_screens = measure_png_vs_scrot(client, runtime, sandbox, args.png_samples)
            settled, fixed, correct, fixed_correct = measure_settle(client, args.settle_samples)
        theirs = baseline(runtime, sandbox, args.baseline_samples)
    finally:
        runtime.remove(sandbox.id)

    rows = [row(k, v) for k, v in ours.items()]
    ref_rows = [row(k, v) for k, v in theirs.items()]
    settle_rows = [row("click -> settled screenshot", settled), row("click -> sleep(2 s) -> screenshot", fixed)]
    by_name = {r["name"]: r for r in rows + ref_rows + settle_rows}
    ratios = {
        "click: xdotool subprocess / corral": by_name["xdotool click"]["p50_ms"] / by_name["click"]["p50_ms"],
        "key: xdotool subprocess / corral": by_name["xdotool key"]["p50_ms"] / by_name["key"]["p50_ms"],
        "type 20: xdotool subprocess / corral": by_name["xdotool type 20 chars"]["p50_ms"]
        / by_name["type 20 chars"]["p50_ms"],
        "screenshot: scrot png / corral png": by_name["scrot png"]["p50_ms"] / by_name["screenshot png"]["p50_ms"],
        "after-action shot: fixed 2 s sleep / settled": by_name["click -> sleep(2 s) -> screenshot"]["p50_ms"]
        / by_name["click -> settled screenshot"]["p50_ms"],
    }
    budgets = {
        k: {"budget_ms": v, "p50_ms": by_name[k]["p50_ms"], "ok": by_name[k]["p50_ms"] <= v}
        for k, v in BUDGETS_MS.items()
    }
    # The worst screen's ratios are the row's: every screen must meet both.
    png_speed = min(screen["speed_ratio"] for screen in png_screens)
    png_size = max(screen["size_ratio"] for screen in png_screens)
    png_budgets = {
        "PNG screenshot vs scrot, same run: speed": {
            "value": png_speed,
            "op": ">=",
            "budget": PNG_SPEED_RATIO_MIN,
            "ok": png_speed >= PNG_SPEED_RATIO_MIN,
        },
        "PNG screenshot vs scrot, same run: size": {
            "value": png_size,
            "op": "<=",
            "budget": PNG_SIZE_RATIO_MAX,
            "ok": png_size <= PNG_SIZE_RATIO_MAX,
        },
    }

    print(f"sandbox ready (container start to /healthz 200): {ready_s * 1000:.0f} ms\n")
    print(f"{'Corral over WebSocket (1280x800)':<44}{'p50 ms':>10}{'p95 ms':>10}{'n':>6}")
    for r in rows:
        print(f"  {r['name']:<42}{r['p50_ms']:>10.2f}{r['p95_ms']:>10.2f}{r['n']:>6}")
    print(f"\n{'Reference approach, inside the sandbox':<44}{'p50 ms':>10}{'p95 ms':>10}{'n':>6}")
    for r in ref_rows:
        print(f"  {r['name']:<42}{r['p50_ms']:>10.2f}{r['p95_ms']:>10.2f}{r['n']:>6}")
    print(f"\n{'Action to screenshot on a re-rendering page':<44}{'p50 ms':>10}{'p95 ms':>10}{'n':>6}")
    for r in settle_rows:
        print(f"  {r['name']:<42}{r['p50_ms']:>10.2f}{r['p95_ms']:>10.2f}{r['n']:>6}")
    print(
        f"  screenshots showing the final render: settled {correct}/{len(settled)}, "
        f"fixed sleep {fixed_correct}/{len(fixed)}"
    )
    print(
        f"\n{'PNG screenshot vs scrot, same screen (1280x800)':<36}{'corral ms':>10}{'scrot ms':>10}"
        f"{'speed':>8}{'corral B':>10}{'scrot B':>10}{'size':>7}"
    )
    for p in png_screens:
        print(
            f"  {p['screen']:<34}{p['corral_p50_ms']:>10.2f}{p['scrot_p50_ms']:>10.2f}{p['speed_ratio']:>7.2f}x"
            f"{p['corral_bytes']:>10}{p['scrot_bytes']:>10}{p['size_ratio']:>7.3f}"
        )
    print("\nRatios (p50, same run)")
    for k, v in ratios.items():
        print(f"  {k:<50}{v:>8.1f}x")
    print("\nBudgets (p50)")
    for k, b in budgets.items():
        print(f"  {k:<30} {b['p50_ms']:>8.2f} ms  <= {b['budget_ms']:>5.1f} ms  {'ok' if b['ok'] else 'OVER'}")
    for k, r in png_budgets.items():
        print(f"  {k}  {r['value']:.2f} x  {r['op']}  {r['budget']:.1f} x  {'ok' if r['ok'] else 'OVER'}")

    RESULTS.mkdir(exist_ok=True)
    out = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ready_ms": round(ready_s * 1000),
        "corral": rows,
        "reference": ref_rows,
        "settle": settle_rows,
        "final_render_shown": {"settled": f"{correct}/{len(settled)}", "fixed": f"{fixed_correct}/{len(fixed)}"},
        "ratios": {k: round(v, 1) for k, v in ratios.items()},
        "png_vs_scrot": png_screens,
        "budgets": budgets,
        "png_budgets": png_budgets,
    }
    (RESULTS / "latest.json").write_text(json.dumps(out, indent=2))
    print(f"\nwrote {RESULTS / 'latest.json'}")
    return 0 if all(b["ok"] for b in [*budgets.values(), *png_budgets.values()]) else 1


if __name__ == "__main__":
    sys.exit(main())
