"""`scripts/corral up` on a fresh machine: the README's main command, timed from a clean copy of this tree
until the gateway answers, INCLUDING the Docker engine's install, with its output read through a pipe (not
a terminal) as CI or a log sees it.

The fresh machine is a container of the host's engine (the host's engine itself is never touched: no
install, restart or setting of it): Debian bookworm with what a machine of this kind has before Corral
(python3 with venv and pip, ca-certificates with the host's own CAs, needrestart, man-db, git), and NO
Docker. `up` installs the engine in it from Debian (scripts/ensure-docker), starts that dockerd (its data
root on a volume of the run's own, its bridge and iptables in the machine's network namespace), makes
its virtualenv, debootstraps or pulls its Debian bases, builds both images and starts the gateway, all
inside. The machine gets every capability the host's engine may grant but CAP_SYS_RESOURCE (the host's
engine runs without it, so `--privileged` is refused), no seccomp or AppArmor profile, and its cgroup
hierarchies remounted writable in its own cgroup namespace: what its dockerd needs to run containers.
Untimed, before the clock starts: building the machine's image (`--keep-machine` keeps it for the next
run) and starting the machine. At the end the machine's engine is stopped and the machine, its volume,
its network and the copy are removed.

    .venv/bin/python bench/up.py                 # the README's way
    .venv/bin/python bench/up.py --as-before     # main's way before issue 16: the test environments
                                                 # installed too, the images built one after the other
    .venv/bin/python bench/up.py --tree DIR      # another checkout's `up` (e.g. an older commit's, exported
                                                 # with git archive), on the same terms
Slow (minutes): scripts/bench runs it only with --up. Run it under the bench lock where benches share a host.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RUN = "benchup"  # this run's names: never the shared ones
MACHINE_IMAGE = f"corral-fresh-machine:{RUN}"
MACHINE = f"corral-{RUN}-machine"
MACHINE_VOLUME = f"corral-{RUN}-machine-docker"  # the machine engine's data root
MACHINE_NETWORK = f"corral-{RUN}-machine-net"
TREE_IN_MACHINE = "/root/corral"
# The machine's Debian: the first of these the host has (the host's engine pulls nothing for it).
MACHINE_BASES = ("debian:bookworm-slim", "corral-base:bookworm")
# What a Debian machine of this kind has before Corral: Python with venv and pip, the CA store, and the
# distribution's usual hooks (needrestart's and man-db's run after every apt install).
MACHINE_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pip",
    "ca-certificates",
    "needrestart",
    "man-db",
    "git",
    "procps",
)
HOST_CAS = Path("/usr/local/share/ca-certificates")
# The host's settings that point tools at its CA bundle: the fresh machine has them as the host does.
CA_SETTINGS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "LANG")
# A machine's init leaves /sys and its cgroup hierarchies writable, which its engine needs; a container's
# are read-only, so they are mounted anew here (in the machine's own cgroup namespace) before it idles.
MACHINE_BOOT = """#!/bin/sh
set -eu
mount -o remount,rw /sys
grep ' cgroup ' /proc/mounts | while read -r _ dir _ options _; do
  umount "$dir"
  mount -t cgroup -o "rw,${options#ro,}" cgroup "$dir"
done
if grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts; then
  umount /sys/fs/cgroup
  mount -t cgroup2 cgroup2 /sys/fs/cgroup
fi
exec sleep infinity
"""
BUDGET_S = 180.0
SILENCE_BUDGET_S = 10.0
# The phases, each ended by the first line of up's output that matches (times from the start).
PHASES = {
    "Docker engine installed and running": re.compile(r"\[ensure-docker\] docker ready"),
    "virtualenv (bootstrap)": re.compile(r"\[bootstrap\] (installed|up to date)|\] (desktop|egress): "),
    "desktop base (bookworm)": re.compile(r"desktop: (imported|pulled|building corral-desktop)"),
    "egress base (trixie)": re.compile(r"egress: (imported|pulled|building corral-egress)"),
    "egress image built": re.compile(r"egress: built "),
    "desktop image built": re.compile(r"desktop: built "),
    "gateway answering": re.compile(r"gateway up on "),
}
# Lines that must not reach a log: apt's, dpkg's and needrestart's chatter and any progress or scanning bar.
NOISE = re.compile(r"perl: warning|debconf: |Scanning processes|Scanning linux images|\[=+|\d+%\s*\[|#+\s*\d+%|\r")


@dataclass(frozen=True)
class Line:
    at_s: float
    text: str


def _docker(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} failed: {result.stderr.strip()[-1500:]}")
    return result


def _exists(kind: str, name: str) -> bool:
    return _docker(kind, "inspect", name).returncode == 0


def _machine_base() -> str:
    for base in MACHINE_BASES:
        if _exists("image", base):
            return base
    raise RuntimeError(
        f"no Debian bookworm image on the host for the fresh machine (one of {', '.join(MACHINE_BASES)})"
    )


def _machine_dockerfile(base: str) -> str:
    return (
        f"FROM {base}\n"
        "ARG DEBIAN_FRONTEND=noninteractive\n"
        f"RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends {' '.join(MACHINE_PACKAGES)}"
        " >/dev/null && rm -rf /var/lib/apt/lists/*\n"
        "COPY cas/ /usr/local/share/ca-certificates/\n"
        "RUN update-ca-certificates >/dev/null\n"
        "COPY machine-boot /usr/local/sbin/machine-boot\n"
        'ENTRYPOINT ["/usr/local/sbin/machine-boot"]\n'
    )


def _build_machine_image() -> None:
    """The fresh machine's image (untimed: it stands for the machine as it is delivered)."""
    if _exists("image", MACHINE_IMAGE):
        return
    base = _machine_base()
    with tempfile.TemporaryDirectory(prefix="corral-fresh-machine-") as tmp:
        context = Path(tmp)
        (context / "cas").mkdir()
        for ca in sorted(HOST_CAS.glob("*.crt")) if HOST_CAS.is_dir() else []:
            shutil.copy(ca, context / "cas" / ca.name)
        (context / "Dockerfile").write_text(_machine_dockerfile(base))
        boot = context / "machine-boot"
        boot.write_text(MACHINE_BOOT)
        boot.chmod(0o755)
        print(f"building the fresh machine's image {MACHINE_IMAGE} on {base} (untimed)", flush=True)
        _docker("build", "-q", "-t", MACHINE_IMAGE, str(context), check=True)


def _start_machine(tree: Path) -> None:
    _docker("network", "create", MACHINE_NETWORK, check=True)
    resolv = tree.parent / f"{tree.name}-resolv.conf"
    # The host's resolvers, not the engine's embedded one (127.0.0.11 is unreachable from the machine's
    # own containers, whose builds fetch from Debian's mirror and PyPI).
    resolv.write_text(Path("/etc/resolv.conf").read_text())
    _docker(
        "run", "-d", "--name", MACHINE, "--hostname", "fresh-machine", "--network", MACHINE_NETWORK,
        "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--security-opt", "systempaths=unconfined", "--device-cgroup-rule", "a *:* rwm", "--cgroupns", "private",
        "--tmpfs", "/run", "--tmpfs", "/tmp", *_loop_devices(),
        "-v", f"{MACHINE_VOLUME}:/var/lib/docker", "-v", f"{tree}:{TREE_IN_MACHINE}",
        "-v", f"{resolv}:/etc/resolv.conf:ro",
        MACHINE_IMAGE,
        check=True,
    )  # fmt: skip
    for _ in range(50):
        if _docker("exec", MACHINE, "test", "-w", "/sys/fs/cgroup/devices").returncode == 0 or _cgroup2():
            return
        time.sleep(0.1)
    raise RuntimeError(f"the fresh machine did not boot: {_docker('logs', MACHINE).stderr[-1000:]}")


def _loop_devices() -> list[str]:
    """The loop devices' control node, as a machine has it: the gateway's compose service asks for it
    (workspace volumes), and its engine refuses to start the gateway without it."""
    return ["--device", "/dev/loop-control"] if Path("/dev/loop-control").exists() else []


def _cgroup2() -> bool:
    return _docker("exec", MACHINE, "test", "-f", "/sys/fs/cgroup/cgroup.controllers").returncode == 0


def _stop_engine() -> None:
    """Stop the machine's dockerd the way a shutdown would (it stops its containers): nothing of them
    is left in the host's cgroups when the machine goes."""
    pid = _docker("exec", MACHINE, "cat", "/var/run/docker.pid").stdout.strip()
    if not pid.isdigit():
        return
    _docker("exec", MACHINE, "kill", "-TERM", pid)
    for _ in range(300):
        if _docker("exec", MACHINE, "kill", "-0", pid).returncode != 0:
            return
        time.sleep(0.1)


@contextmanager
def fresh_machine(tree: Path, keep_image: bool) -> Iterator[None]:
    """A machine without Docker, with ``tree`` at TREE_IN_MACHINE; removed whole at the end."""
    leftovers = [name for kind, name in _ours() if _exists(kind, name)]
    if leftovers:
        raise RuntimeError(f"{', '.join(leftovers)} left by an earlier run: remove them first")
    _build_machine_image()
    try:
        _start_machine(tree)
        yield
    finally:
        if _exists("container", MACHINE):
            # The virtualenv's corral, not scripts/corral: a run that failed early must not install it now.
            if (tree / ".venv" / "bin" / "corral").exists():
                _docker("exec", "-w", TREE_IN_MACHINE, MACHINE, ".venv/bin/corral", "down")
            _stop_engine()
        _docker("rm", "-f", "-v", MACHINE)
        _docker("volume", "rm", MACHINE_VOLUME)
        _docker("network", "rm", MACHINE_NETWORK)
        if not keep_image:
            _docker("rmi", MACHINE_IMAGE)


def _ours() -> list[tuple[str, str]]:
    return [("container", MACHINE), ("volume", MACHINE_VOLUME), ("network", MACHINE_NETWORK)]


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


def _environment(as_before: bool) -> list[str]:
    """``docker exec``'s ``-e`` options: the host's CA settings and locale, nothing of Corral's."""
    env = [f"{key}={os.environ[key]}" for key in CA_SETTINGS if key in os.environ]
    if as_before:
        env.append("CORRAL_BUILD_JOBS=1")
    return list(itertools.chain.from_iterable(("-e", item) for item in env))


def _run(argv: list[str], env: list[str], start: float, lines: list[Line]) -> int:
    """Run ``argv`` in the machine, in the tree, its output through a pipe, each line kept with its time and echoed."""
    command = ["docker", "exec", "-i", "-w", TREE_IN_MACHINE, *env, MACHINE, *argv]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
    ) as process:
        assert process.stdout is not None
        for text in process.stdout:
            line = Line(time.monotonic() - start, text.rstrip("\n"))
            lines.append(line)
            print(f"  {line.at_s:6.1f} s | {line.text}", flush=True)
    return process.returncode


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


def _noise(lines: list[Line]) -> list[str]:
    return [line.text for line in lines if NOISE.search(line.text)]


def _timed(tree: Path, as_before: bool, lines: list[Line]) -> tuple[int, float]:
    env = _environment(as_before)
    start = time.monotonic()
    code = _run(["scripts/bootstrap", "--tests"], env, start, lines) if as_before else 0
    code = code or _run(["scripts/corral", "up"], env, start, lines)
    return code, time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--as-before", action="store_true", help="install the test environments too and build one image at a time"
    )
    parser.add_argument("--tree", type=Path, help="time this checkout's `scripts/corral up` instead of this one's")
    parser.add_argument("--keep-machine", action="store_true", help="keep the fresh machine's image for the next run")
    parser.add_argument(
        "--machine-only", action="store_true", help="only build the fresh machine's image (outside the bench lock)"
    )
    args = parser.parse_args()
    if args.machine_only:
        _build_machine_image()
        return 0
    tree = Path(tempfile.mkdtemp(prefix="corral-up-bench-"))
    lines: list[Line] = []
    try:
        _copy_tree(tree, args.tree)
        with fresh_machine(tree, args.keep_machine):
            code, total_s = _timed(tree, args.as_before, lines)
    except RuntimeError as exc:
        print(f"bench/up.py: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        Path(f"{tree}-resolv.conf").unlink(missing_ok=True)
    if code != 0:
        print(f"scripts/corral up failed ({code})", file=sys.stderr)
        return 1
    way = "as before (test environments too, one image at a time)" if args.as_before else "the README's way"
    if args.tree is not None:
        way += f", the tree at {args.tree}"
    return _report(way, lines, total_s, "up.json" if not (args.as_before or args.tree) else "up-before.json")


def _report(way: str, lines: list[Line], total_s: float, result_name: str) -> int:
    phases = _phases(lines, total_s)
    silence = _longest_silence(lines, total_s)
    noise = _noise(lines)
    print(f"\nscripts/corral up on a fresh machine (the engine's install included), {way}: phases ended at (s)")
    for name, at_s in sorted(phases.items(), key=lambda item: item[1]):
        print(f"  {name:<40}{at_s:>8.1f}")
    print("\nBudgets")
    rows = {
        "corral up on a fresh machine": (total_s, BUDGET_S, "s"),
        "longest silence in up's output": (silence, SILENCE_BUDGET_S, "s"),
        "noise lines (apt, perl, progress bars)": (float(len(noise)), 0.0, " "),
    }
    passed = True
    for name, (value, budget, unit) in rows.items():
        good = value <= budget
        passed = passed and good
        print(f"  {name:<40}{value:>8.1f} {unit}  <= {budget:>6.1f} {unit}  {'ok' if good else 'OVER'}")
    for text in noise[:10]:
        print(f"    noise: {text[:160]!r}")
    RESULTS.mkdir(exist_ok=True)
    result = {"way": way, "total_s": total_s, "longest_silence_s": silence, "noise_lines": noise, "phases_s": phases}
    (RESULTS / result_name).write_text(json.dumps(result, indent=2))
    print(f"\nwrote {RESULTS / result_name}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
