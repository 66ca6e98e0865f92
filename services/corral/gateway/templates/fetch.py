"""A template's Python and npm packages fetched on the gateway's host, as the base's own wheelhouse
is (corral.images): no HTTPS is needed inside the build, where a registry's certificate may not
verify. pip downloads wheels for the image's Python (3.11) and platform (manylinux) into a
wheelhouse, installed inside with ``--no-index``; npm resolves the packages into a cache of its own
(scripts never run on the host), installed inside with ``--offline`` from that cache."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from corral.errors import TemplateBuildFailed
from corral.images import platform_tags

IMAGE_PYTHON = "3.11"  # the desktop image's (bookworm)
FETCH_TIMEOUT_S = 600
MAX_FETCHED_BYTES = 256 << 20  # the engine's context is assembled in the gateway's memory
OUTPUT_TAIL = 3000

Sink = Callable[[str], None]


def pip_download_argv(requirements: Sequence[str], dest: Path, arch: str) -> list[str]:
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input"]
    argv += ["-d", str(dest), "--only-binary=:all:", "--python-version", IMAGE_PYTHON, "--implementation", "cp"]
    for tag in platform_tags(arch):
        argv += ["--platform", tag]
    return [*argv, *requirements]


def npm_fetch_argv(packages: Sequence[str], prefix: Path, cache: Path) -> list[str]:
    # --ignore-scripts: a package's install scripts run inside the build, never on the gateway's host.
    return [
        "npm",
        "install",
        "--prefix",
        str(prefix),
        "--cache",
        str(cache),
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--no-save",
        "--no-package-lock",
        *packages,
    ]


def _run(step: str, argv: list[str], sink: Sink) -> None:
    sink(step)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=FETCH_TIMEOUT_S)
    except FileNotFoundError:
        raise TemplateBuildFailed(f"{step}: {argv[0]} is not installed on the gateway's host", step=step) from None
    except subprocess.TimeoutExpired:
        raise TemplateBuildFailed(f"{step}: over {FETCH_TIMEOUT_S} s", step=step) from None
    output = (done.stdout + done.stderr)[-OUTPUT_TAIL:]
    for line in output.splitlines()[-10:]:
        sink(line)
    if done.returncode != 0:
        raise TemplateBuildFailed(f"{step}: exit code {done.returncode}", step=step, output=output)


def _collect(root: Path, prefix: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    total = 0
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
            if total > MAX_FETCHED_BYTES:
                raise TemplateBuildFailed(f"the fetched packages are over {MAX_FETCHED_BYTES >> 20} MiB", step="fetch")
            out[f"{prefix}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return out


def fetch_wheels(requirements: Sequence[str], arch: str, prefix: str, sink: Sink) -> dict[str, bytes]:
    """The wheels of ``requirements`` and their dependencies, context path -> bytes."""
    with tempfile.TemporaryDirectory(prefix="corral-template-wheels-") as tmp:
        _run("pip download (on the gateway's host)", pip_download_argv(requirements, Path(tmp), arch), sink)
        return _collect(Path(tmp), prefix)


def fetch_npm(packages: Sequence[str], prefix: str, sink: Sink) -> dict[str, bytes]:
    """npm's cache after resolving ``packages`` (tarballs and metadata), context path -> bytes."""
    with tempfile.TemporaryDirectory(prefix="corral-template-npm-") as tmp:
        cache = Path(tmp) / "cache"
        _run(
            "npm install (on the gateway's host, no scripts)",
            npm_fetch_argv(packages, Path(tmp) / "stage", cache),
            sink,
        )
        return _collect(cache, prefix)
