"""`scripts/corral up` on a fresh machine: the README's main command, timed from a clean copy of this tree
until the gateway answers, with its output read through a pipe (not a terminal) as CI or a log sees it.

"Fresh" here means everything `up` makes is made anew, from the network:
- no virtualenv: the command runs in a copy of the tree's files (git's tracked and untracked ones, none
  ignored: no .venv, no wheelhouse), with an empty pip cache (PIP_CACHE_DIR in the copy);
- no Debian bases: they are debootstrapped from the mirror under a repository of the run's own
  (CORRAL_BASE_REPOSITORY), so the shared `corral-base:*` are neither used nor touched; the run refuses
  to start where `debian:bookworm-slim` or `debian:trixie-slim` are present (`up` would use them);
- no images and no build cache for them: the images get the run's own tags (CORRAL_IMAGE,
  CORRAL_EGRESS_IMAGE) and every layer sits on the new bases, so no cached layer can match.
What a fresh machine has and this run does not time: the Docker engine and debootstrap themselves
(scripts/ensure-docker installs them where missing; that is the distribution's apt, not Corral's).
At the end the gateway is stopped and everything the run made is removed (images, bases, the copy).

    .venv/bin/python bench/up.py                 # the README's way
    .venv/bin/python bench/up.py --as-before     # main's way before issue 16: the test environments
                                                 # installed too, the images built one after the other
    .venv/bin/python bench/up.py --tree DIR      # another checkout's `up` (e.g. an older commit's, exported
                                                 # with git archive), on the same terms
Slow (minutes): scripts/bench runs it only with --up.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RUN = "benchup"  # this run's tags and names: never the shared ones
BASE_REPOSITORY = f"corral-base-{RUN}"
DESKTOP_IMAGE = f"corral-desktop:{RUN}"
EGRESS_IMAGE = f"corral-egress:{RUN}"
UPSTREAM_BASES = ("debian:bookworm-slim", "debian:trixie-slim")
BUDGET_S = 180.0
SILENCE_BUDGET_S = 10.0
# The phases, each ended by the first line of up's output that matches (times from the start).
PHASES = {
    "virtualenv (bootstrap)": re.compile(r"\] (desktop|egress): "),
    "desktop base (debootstrap bookworm)": re.compile(r"desktop: (imported|building corral-desktop)"),
    "egress base (debootstrap trixie)": re.compile(r"egress: (imported|building corral-egress)"),
    "egress image built": re.compile(r"egress: built "),
    "desktop image built": re.compile(r"desktop: built "),
    "gateway answering": re.compile(r"gateway up on "),
}


@dataclass(frozen=True)
class Line:
    at_s: float
    text: str


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False)


def _refusal() -> str | None:
    """Why this machine cannot give a fresh run, or None."""
    if _docker("container", "inspect", "corral-gateway").returncode == 0:
        return "a corral-gateway container exists (its name is fixed): run `scripts/corral down` first"
    present = [image for image in UPSTREAM_BASES if _docker("image", "inspect", image).returncode == 0]
    if present:
        return f"{', '.join(present)} present: `up` would build on them instead of debootstrapping"
    ours = [image for image in _made() if _docker("image", "inspect", image).returncode == 0]
    if ours:
        return f"{', '.join(ours)} left by an earlier run: remove them (docker rmi)"
    return None


def _made() -> list[str]:
    return [DESKTOP_IMAGE, EGRESS_IMAGE, f"{BASE_REPOSITORY}:bookworm", f"{BASE_REPOSITORY}:trixie"]


def _copy_tree(target: Path, source_tree: Path | None) -> None:
    """This tree's files as a clone would have them, plus untracked ones not ignored (work in progress);
    or ``source_tree``'s, all of them (an exported checkout has nothing ignored in it)."""
    if source_tree is not None:
        shutil.copytree(source_tree, target, dirs_exist_ok=True)
        return
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (item.decode() for item in listed)):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _environment(tree: Path, jobs: int | None) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("CORRAL_") and key not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_CACHE_DIR")
    }
    env.update(
        PIP_CACHE_DIR=str(tree / ".pip-cache"),
        CORRAL_BASE_REPOSITORY=BASE_REPOSITORY,
        CORRAL_IMAGE=DESKTOP_IMAGE,
        CORRAL_EGRESS_IMAGE=EGRESS_IMAGE,
        CORRAL_PORT=str(_free_port()),
        CORRAL_INSTANCE=RUN,
        CORRAL_DATA_DIR=str(tree / ".data"),
    )
    if jobs is not None:
        env["CORRAL_BUILD_JOBS"] = str(jobs)
    return env


def _run(argv: list[str], tree: Path, env: dict[str, str], start: float, lines: list[Line]) -> int:
    """Run ``argv`` in ``tree``, its output through a pipe, each line kept with its time and echoed."""
    with subprocess.Popen(
        argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
    ) as process:
        assert process.stdout is not None
        for text in process.stdout:
            line = Line(time.monotonic() - start, text.rstrip())
            lines.append(line)
            print(f"  {line.at_s:6.1f} s | {line.text}", flush=True)
    return process.returncode


def _clean_up(tree: Path, env: dict[str, str]) -> None:
    subprocess.run([str(tree / "scripts" / "corral"), "down"], cwd=tree, env=env, capture_output=True, check=False)
    for image in _made():
        _docker("rmi", image)
    shutil.rmtree(tree, ignore_errors=True)


def _phases(lines: list[Line], total_s: float) -> dict[str, float]:
    ended: dict[str, float] = {}
    for name, pattern in PHASES.items():
        hit = next((line.at_s for line in lines if pattern.search(line.text)), None)
        if hit is not None:
            ended[name] = hit
    ended.setdefault("gateway answering", total_s)
    return ended


def _longest_silence(lines: list[Line], total_s: float) -> float:
    times = [0.0, *(line.at_s for line in lines), total_s]
    return max(later - earlier for earlier, later in itertools.pairwise(times))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--as-before", action="store_true", help="install the test environments too and build one image at a time"
    )
    parser.add_argument("--tree", type=Path, help="time this checkout's `scripts/corral up` instead of this one's")
    args = parser.parse_args()
    refusal = _refusal()
    if refusal is not None:
        print(f"not a fresh run: {refusal}", file=sys.stderr)
        return 2
    tree = Path(tempfile.mkdtemp(prefix="corral-up-bench-"))
    _copy_tree(tree, args.tree)
    env = _environment(tree, 1 if args.as_before else None)
    lines: list[Line] = []
    start = time.monotonic()
    try:
        code = _run([str(tree / "scripts" / "bootstrap"), "--tests"], tree, env, start, lines) if args.as_before else 0
        code = code or _run([str(tree / "scripts" / "corral"), "up"], tree, env, start, lines)
        total_s = time.monotonic() - start
    finally:
        _clean_up(tree, env)
    if code != 0:
        print(f"scripts/corral up failed ({code})", file=sys.stderr)
        return 1
    way = "as before (test environments too, one image at a time)" if args.as_before else "the README's way"
    if args.tree is not None:
        way += f", the tree at {args.tree}"
    phases = _phases(lines, total_s)
    silence = _longest_silence(lines, total_s)
    print(f"\nscripts/corral up on a fresh machine, {way}: phases ended at (s from the start)")
    for name, at_s in sorted(phases.items(), key=lambda item: item[1]):
        print(f"  {name:<40}{at_s:>8.1f}")
    print("\nBudgets")
    rows = {
        "corral up on a fresh machine": (total_s, BUDGET_S),
        "longest silence in up's output": (silence, SILENCE_BUDGET_S),
    }
    passed = True
    for name, (value, budget) in rows.items():
        good = value <= budget
        passed = passed and good
        print(f"  {name:<40}{value:>8.1f} s  <= {budget:>6.1f} s  {'ok' if good else 'OVER'}")
    RESULTS.mkdir(exist_ok=True)
    result = {"way": way, "total_s": total_s, "longest_silence_s": silence, "phases_s": phases}
    name = "up.json" if not (args.as_before or args.tree) else "up-before.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2))
    print(f"\nwrote {RESULTS / name}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
