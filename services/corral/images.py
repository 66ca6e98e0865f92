"""Building Corral's images on any machine with Docker, registry or not.

The desktop Dockerfile is an ordinary one. What this adds for machines without
a registry or without HTTPS from inside containers: a Debian base made locally
with debootstrap + ``docker import``, and a wheelhouse downloaded on the host
so the image installs its Python packages with ``--no-index``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from corral.errors import ImageBuildError
from corral.runtime.docker import DockerRuntime

# The same variables as the gateway's settings, so a build, the tests and a gateway agree on the tags.
DESKTOP_IMAGE = os.environ.get("CORRAL_IMAGE") or "corral-desktop:latest"
EGRESS_IMAGE = os.environ.get("CORRAL_EGRESS_IMAGE") or "corral-egress:latest"
DEBIAN_SUITE = "bookworm"  # the desktop's (Python 3.11, Chromium from bookworm-security)
EGRESS_SUITE = "trixie"  # the egress sidecar's (Python 3.13, for mitmproxy 12)
DEFAULT_MIRROR = "http://deb.debian.org/debian"

Log = Callable[[str], None]


def repo_root() -> Path:
    """The source tree holding images/ (the working copy this package was installed from)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "images" / "desktop" / "Dockerfile").is_file():
            return parent
    raise ImageBuildError("images/desktop/Dockerfile not found; run from a Corral source checkout")


def upstream_base(suite: str) -> str:
    return f"debian:{suite}-slim"


def local_base(suite: str) -> str:
    return f"corral-base:{suite}"


def _sources_list(mirror: str, suite: str = DEBIAN_SUITE) -> str:
    security = mirror.rsplit("/debian", 1)[0] + "/debian-security" if mirror.endswith("/debian") else mirror
    return f"deb {mirror} {suite} main\ndeb {mirror} {suite}-updates main\ndeb {security} {suite}-security main\n"


def debootstrap_base(runtime: DockerRuntime, log: Log, mirror: str | None = None, suite: str = DEBIAN_SUITE) -> str:
    """Make ``corral-base:<suite>`` from Debian's mirror (about a minute); needs root and debootstrap."""
    mirror = mirror or os.environ.get("CORRAL_DEBIAN_MIRROR", DEFAULT_MIRROR)
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImageBuildError(
            f"no registry gave {upstream_base(suite)} and debootstrap is missing: install it "
            "(apt-get install debootstrap) or set CORRAL_BASE_IMAGE (CORRAL_EGRESS_BASE_IMAGE for trixie) "
            f"to a Debian {suite} image you have"
        )
    with tempfile.TemporaryDirectory(prefix="corral-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrap {suite} from {mirror} (no registry reachable)")
        result = subprocess.run(
            [debootstrap, "--variant=minbase", suite, str(rootfs), mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ImageBuildError(f"debootstrap failed ({result.returncode}):\n{result.stderr[-2000:]}")
        (rootfs / "etc" / "apt" / "sources.list").write_text(_sources_list(mirror, suite))
        # trixie's debootstrap writes deb822 sources too; one list is enough.
        (rootfs / "etc" / "apt" / "sources.list.d" / "debian.sources").unlink(missing_ok=True)
        # Keep images small: no apt cache, no docs.
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        repository, tag = local_base(suite).split(":")
        runtime.import_rootfs(tarball, repository, tag)
    log(f"imported {local_base(suite)}")
    return local_base(suite)


def ensure_base_image(runtime: DockerRuntime, log: Log, suite: str = DEBIAN_SUITE) -> str:
    """A Debian base of ``suite``: $CORRAL_BASE_IMAGE (bookworm) or $CORRAL_EGRESS_BASE_IMAGE
    (trixie), a local one, a pulled one, or one made here."""
    chosen = os.environ.get("CORRAL_BASE_IMAGE" if suite == DEBIAN_SUITE else "CORRAL_EGRESS_BASE_IMAGE")
    if chosen:
        if not runtime.image_exists(chosen) and not runtime.try_pull(chosen):
            raise ImageBuildError(f"base image {chosen} is neither present nor pullable")
        return chosen
    for candidate in (upstream_base(suite), local_base(suite)):
        if runtime.image_exists(candidate):
            return candidate
    if runtime.try_pull(upstream_base(suite)):
        log(f"pulled {upstream_base(suite)}")
        return upstream_base(suite)
    return debootstrap_base(runtime, log, suite=suite)


def _platform_tags(arch: str) -> list[str]:
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    return [f"manylinux_2_{minor}_{machine}" for minor in (36, 34, 28, 27, 24, 17)] + [
        f"manylinux2014_{machine}",
        f"manylinux1_{machine}",
        f"linux_{machine}",
    ]


def build_wheelhouse(root: Path, arch: str, log: Log, image_dir: str = "images/desktop", python: str = "3.11") -> None:
    """Download an image's wheels on the host, for the image's Python and architecture."""
    desktop = root / image_dir
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "-r",
        str(desktop / "requirements.txt"),
        "-d",
        str(desktop / "wheels"),
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
    ]
    for tag in _platform_tags(arch):
        cmd += ["--platform", tag]
    log(f"downloading {image_dir}'s wheels on the host (Python {python})")
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageBuildError(f"pip download failed:\n{result.stderr[-3000:]}")


def build_desktop(runtime: DockerRuntime, log: Log, *, tag: str = DESKTOP_IMAGE, wheelhouse: bool = True) -> str:
    """Build ``corral-desktop`` from images/desktop/Dockerfile.

    Layers are ordered so that a code change rebuilds only the last one (seconds).
    """
    root = repo_root()
    base = ensure_base_image(runtime, log)
    if wheelhouse and os.environ.get("CORRAL_WHEELHOUSE", "1") != "0":
        build_wheelhouse(root, runtime.architecture, log)
    log(f"building {tag} on {base}")
    runtime.build(root, "images/desktop/Dockerfile", tag, {"BASE_IMAGE": base}, log)
    return tag


def build_egress(runtime: DockerRuntime, log: Log, *, tag: str = EGRESS_IMAGE, wheelhouse: bool = True) -> str:
    """Build ``corral-egress`` (the per-session mitmproxy sidecar) from proxy/Dockerfile."""
    root = repo_root()
    base = ensure_base_image(runtime, log, EGRESS_SUITE)
    if wheelhouse and os.environ.get("CORRAL_WHEELHOUSE", "1") != "0":
        build_wheelhouse(root, runtime.architecture, log, "proxy", "3.13")
    log(f"building {tag} on {base}")
    runtime.build(root, "proxy/Dockerfile", tag, {"BASE_IMAGE": base}, log)
    return tag
