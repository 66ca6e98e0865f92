"""What letting idle spare shepherds go costs a command: the launcher and its client, the sandbox's own
code, run here as this user (the agent's ids the same as the controller's, as the unit tests run them).

A spawn of ``true``, timed from the call to its exit, two ways, interleaved:
- warm: right after another command, with the client's reserved spares (and the launcher's) held, so
  the job goes straight to a child forked ahead;
- after idle: once both sides let their spares go (``spare_idle_s``, 45 s in a sandbox, shortened here),
  so the launcher forks a shepherd on the way and the shepherd forks the child.

    .venv/bin/python bench/spares.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corral.sandbox.agent.launcher.client import LauncherClient, Spawned

RESULTS = Path(__file__).resolve().parent / "results"
IDLE_S = 0.4
# The first command after an idle spell may pay for the forks a spare had made ahead, no more.
ADDED_BUDGET_MS = 10.0
SERVE = """
import os, sys
from pathlib import Path
from corral.sandbox.agent.launcher.privileges import Ids
from corral.sandbox.agent.launcher.server import Launcher
me = Ids(os.getuid(), os.getgid())
launcher = Launcher(Path(sys.argv[1]), me, me)
launcher.spare_idle_s = float(sys.argv[2])
launcher.listen()
launcher.serve()
"""


async def _run_true(client: LauncherClient) -> float:
    stdio = (os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY))
    start = time.perf_counter()
    try:
        spawned = await client.spawn([b"true"], [b"PATH=/usr/bin:/bin"], b"/", stdio)
    finally:
        for fd in stdio:
            os.close(fd)
    assert isinstance(spawned, Spawned), spawned
    while (event := await spawned.control.next_event()) is not None and event.kind != "exited":
        pass
    spawned.control.close()
    return (time.perf_counter() - start) * 1000


async def _rounds(socket_path: Path, rounds: int) -> dict[str, list[float]]:
    client = LauncherClient(socket_path)
    client.spare_idle_s = IDLE_S
    out: dict[str, list[float]] = {"warm": [], "after idle": []}
    try:
        await _run_true(client)  # the first: the connection made, spares reserved after it
        for _ in range(rounds):
            await asyncio.sleep(0.15)  # the spares the last command left reserved again
            out["warm"].append(await _run_true(client))
            await asyncio.sleep(IDLE_S + 0.4)  # both sides let theirs go
            out["after idle"].append(await _run_true(client))
    finally:
        await client.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        socket_path = Path(directory) / "launcher.sock"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "services")}
        server = subprocess.Popen([sys.executable, "-c", SERVE, str(socket_path), str(IDLE_S)], env=env)
        try:
            deadline = time.monotonic() + 10
            while not socket_path.exists():
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the launcher did not start")
                time.sleep(0.01)
            times = asyncio.run(_rounds(socket_path, args.rounds))
        finally:
            server.terminate()
            server.wait(timeout=10)
    medians = {name: statistics.median(values) for name, values in times.items()}
    added = medians["after idle"] - medians["warm"]
    print(f"{'spawn of true to its exit':<40}{'p50 ms':>10}{'p95 ms':>10}{'n':>5}")
    for name, values in times.items():
        p95 = statistics.quantiles(values, n=20)[-1]
        print(f"  {name:<38}{medians[name]:>10.2f}{p95:>10.2f}{len(values):>5}")
    ok = added <= ADDED_BUDGET_MS
    print("\nBudgets")
    print(f"  {'added after idle, p50':<48}{added:>8.2f} ms  <= {ADDED_BUDGET_MS:>5.0f} ms  {'ok' if ok else 'OVER'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spares.json").write_text(json.dumps({"times_ms": times, "added_p50_ms": added}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
