"""The vendors' tools through the gateway, side by side with the native actions they become.

One session; every series runs in the same interleaved rounds, in a new random order each round (the
call after a command pays for its cleanup), so a noisy moment hits them all alike:
``cursor_position`` (the path with no work), ``exec true``, the native ``shell`` and Anthropic's
``bash`` block and OpenAI's ``shell_call`` running ``true``, a ``str_replace`` on a 100 KB file
natively and as a text-editor block, and an ``apply_patch_call`` updating the same file.

    .venv/bin/python bench/tools.py
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
FILE = "/workspace/bench-edit.txt"
LINES = 2_000  # about 100 KB
# What the vendor layer may add to the native action it becomes (pure translation, one dispatcher).
BUDGETS = {
    "bash block vs native shell (x)": ("<=", 1.25),
    "text editor block vs native edit (x)": ("<=", 1.25),
    "bash block p50 (ms)": ("<=", 10.0),
}

Call = Callable[[Sandbox, int], dict[str, Any]]


def _native(action: dict[str, Any]) -> Call:
    return lambda sb, _: sb.request({"action": action})


def _bash_block(sb: Sandbox, n: int) -> dict[str, Any]:
    block = {"type": "tool_use", "id": f"toolu_{n}", "name": "bash", "input": {"command": "true"}}
    return sb.request({"anthropic": block})


def _shell_call(sb: Sandbox, n: int) -> dict[str, Any]:
    item = {"type": "shell_call", "id": f"sh_{n}", "call_id": f"call_{n}", "status": "completed"}
    return sb.request({"openai": {**item, "action": {"commands": ["true"]}}})


def _swap(n: int) -> tuple[str, str]:
    """Line 1000 goes from ``old`` to ``new`` and back, so every round finds exactly one match."""
    a, b = "line 1000 alpha", "line 1000 omega"
    return (a, b) if n % 2 == 0 else (b, a)


def _native_edit(sb: Sandbox, n: int) -> dict[str, Any]:
    old, new = _swap(n)
    edit = {"type": "edit", "command": "str_replace", "path": FILE, "old_str": old, "new_str": new}
    return sb.request({"action": edit})


def _editor_block(sb: Sandbox, n: int) -> dict[str, Any]:
    old, new = _swap(n)
    inp = {"command": "str_replace", "path": FILE, "old_str": old, "new_str": new}
    block = {"type": "tool_use", "id": f"toolu_e{n}", "name": "str_replace_based_edit_tool", "input": inp}
    return sb.request({"anthropic": block})


def _patch_call(sb: Sandbox, n: int) -> dict[str, Any]:
    old, new = _swap(n)
    diff = f"@@\n line 999 alpha\n-{old}\n+{new}\n line 1001 alpha\n"
    item = {"type": "apply_patch_call", "id": f"ap_{n}", "call_id": f"call_p{n}", "status": "completed"}
    return sb.request({"openai": {**item, "operation": {"type": "update_file", "path": FILE, "diff": diff}}})


# Name -> call; each edit series swaps line 1000 there and back in its turn, so any order finds its match.
SERIES: dict[str, Call] = {
    "cursor_position (no work)": _native({"type": "cursor_position"}),
    "exec true": _native({"type": "exec", "argv": ["true"]}),
    "native shell: true": _native({"type": "shell", "command": "true"}),
    "Anthropic bash block: true": _bash_block,
    "OpenAI shell_call: true": _shell_call,
    "native edit: str_replace, 100 KB": _native_edit,
    "text editor block: str_replace, 100 KB": _editor_block,
    "apply_patch_call: update, 100 KB": _patch_call,
}


def _file_text() -> str:
    return "".join(f"line {i} alpha\n" for i in range(1, LINES + 1))


def run_rounds(sb: Sandbox, rounds: int, seed: int = 13) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in SERIES}
    order = list(SERIES)
    shuffle = random.Random(seed).shuffle
    for n in range(rounds):
        shuffle(order)
        for name in order:
            call = SERIES[name]
            for half in (0, 1) if "100 KB" in name else (0,):
                started = time.perf_counter()
                reply = call(sb, 2 * n + half)
                elapsed = (time.perf_counter() - started) * 1000
                if not reply.get("ok"):
                    raise RuntimeError(f"{name}: {reply.get('error')}")
                if half == 0:
                    times[name].append(elapsed)
    return times


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    runtime = DockerHarness()
    instance = f"bench-tools-{os.getpid()}"
    scratch = Path(tempfile.mkdtemp(prefix="corral-bench-tools-"))
    try:
        with gateway_process(instance, scratch / "data") as (url, _), Sandbox.create(url=url, api_key=KEY) as sb:
            sb.files.write(FILE, _file_text())
            run_rounds(sb, 3)  # warm: the launcher, the shell, the editor's first read
            times = run_rounds(sb, args.rounds)
    finally:
        runtime.remove_all({"corral.gateway": instance})
        runtime.remove_network(f"corral-bench-files-{os.getpid()}")
    results = {name: {"p50": statistics.median(t), "p95": _p95(t), "n": len(t)} for name, t in times.items()}
    p50 = {name: r["p50"] for name, r in results.items()}
    measured = {
        "bash block vs native shell (x)": p50["Anthropic bash block: true"] / p50["native shell: true"],
        "text editor block vs native edit (x)": p50["text editor block: str_replace, 100 KB"]
        / p50["native edit: str_replace, 100 KB"],
        "bash block p50 (ms)": p50["Anthropic bash block: true"],
    }
    print(f"{'Vendor tools and their native actions, one session':<52}{'p50':>9}{'p95':>9}")
    for name, r in results.items():
        print(f"  {name + ' (ms)':<50}{r['p50']:>9.2f}{r['p95']:>9.2f}")
    print("\nBudgets")
    passed = True
    for name, (op, budget) in BUDGETS.items():
        value = measured[name]
        good = value <= budget if op == "<=" else value >= budget
        passed = passed and good
        print(f"  {name:<40}{value:>9.2f}  {op} {budget:>6.2f}  {'ok' if good else 'OVER'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tools.json").write_text(json.dumps({**results, "budgets": measured}, indent=2))
    print(f"\nwrote {RESULTS / 'tools.json'}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
