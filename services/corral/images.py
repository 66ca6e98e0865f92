"""Building Corral's images on any machine with Docker, registry or not.

The desktop Dockerfile is an ordinary one. What this adds for machines without
a registry or without HTTPS from inside containers: a Debian base made locally
with debootstrap + ``docker import``, and a wheelhouse downloaded on the host
so the image installs its Python packages with ``--no-index``.

``build_all`` builds the desktop and the egress images side by side: each one's chain (its Debian
base, its wheelhouse, then its Dockerfile) is mostly waiting on a mirror or on apt, so two at once
take little longer than the longer one alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Protocol

from corral import envlines
from corral.errors import ImageBuildError
from corral.runtime.docker import DockerRuntime

# The same variables as the gateway's settings, so a build, the tests and a gateway agree on the tags.
DESKTOP_IMAGE = os.environ.get("CORRAL_IMAGE") or "corral-desktop:latest"
EGRESS_IMAGE = os.environ.get("CORRAL_EGRESS_IMAGE") or "corral-egress:latest"
DEBIAN_SUITE = "bookworm"  # the desktop's (Python 3.11, Chromium from bookworm-security)
EGRESS_SUITE = "trixie"  # the egress sidecar's (Python 3.13, for mitmproxy 12)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Where debootstrapped bases go (``<repository>:<suite>``): another name gives a build its own bases,
# e.g. bench/up.py's fresh-machine run, which must neither reuse nor remove the shared ones.
BASE_REPOSITORY = os.environ.get("CORRAL_BASE_REPOSITORY") or "corral-base"

Log = Callable[[str], None]


class BuildTask(Protocol):
    """Where one image's chain reports: ``step`` for what it starts, ``output`` for the builder's lines."""

    def step(self, text: str) -> None: ...

    def output(self, line: str) -> None: ...

    def done(self, text: str) -> None: ...


def repo_root() -> Path:
    """The source tree holding images/ (the working copy this package was installed from)."""
    root = envlines.checkout_root()
    if root is not None:
        return root
    raise ImageBuildError("images/desktop/Dockerfile not found; run from a Corral source checkout")


def upstream_base(suite: str) -> str:
    return f"debian:{suite}-slim"


def local_base(suite: str) -> str:
    return f"{BASE_REPOSITORY}:{suite}"


def _sources_list(mirror: str, suite: str = DEBIAN_SUITE) -> str:
    security = mirror.rsplit("/debian", 1)[0] + "/debian-security" if mirror.endswith("/debian") else mirror
    return f"deb {mirror} {suite} main\ndeb {mirror} {suite}-updates main\ndeb {security} {suite}-security main\n"


def debootstrap_base(runtime: DockerRuntime, log: Log, mirror: str | None = None, suite: str = DEBIAN_SUITE) -> str:
    """Make ``corral-base:<suite>`` (``$CORRAL_BASE_REPOSITORY:<suite>``) from Debian's mirror (about a
    minute); needs root and debootstrap."""
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
        _speed_up_apt(rootfs)
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        repository, tag = local_base(suite).split(":")
        runtime.import_rootfs(tarball, repository, tag)
    log(f"imported {local_base(suite)}")
    return local_base(suite)


# What Debian's own images on Docker Hub set (debuerreotype's "slimify"): a layer's files need no fsync
# each (a failed build is redone whole, never resumed), and apt fetches no translations.
DPKG_SPEEDUP = "force-unsafe-io\n"
APT_NO_LANGUAGES = 'Acquire::Languages "none";\n'


def _speed_up_apt(rootfs: Path) -> None:
    """Make the base's later ``apt-get install`` runs faster (the images' Dockerfiles run several)."""
    (rootfs / "etc" / "dpkg" / "dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc" / "dpkg" / "dpkg.cfg.d" / "docker-apt-speedup").write_text(DPKG_SPEEDUP)
    (rootfs / "etc" / "apt" / "apt.conf.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc" / "apt" / "apt.conf.d" / "docker-no-languages").write_text(APT_NO_LANGUAGES)


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


def platform_tags(arch: str) -> list[str]:
    """pip's platform tags of a Linux image of ``arch`` (the newest manylinux first)."""
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
        *_agent_requirements(desktop),
        "-d",
        str(desktop / "wheels"),
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
    ]
    for tag in platform_tags(arch):
        cmd += ["--platform", tag]
    log(f"downloading {image_dir}'s wheels on the host (Python {python})")
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageBuildError(f"pip download failed:\n{result.stderr[-3000:]}")


def _agent_requirements(image_dir: Path) -> list[str]:
    """``-r`` of the image's agent-side packages (the desktop's: its kernels' Python), when it has them."""
    agent = image_dir / "requirements-agent.txt"
    return ["-r", str(agent)] if agent.is_file() else []


def _wants_wheelhouse(wheelhouse: bool) -> bool:
    return wheelhouse and os.environ.get("CORRAL_WHEELHOUSE", "1") != "0"


@contextmanager
def _alongside(work: Callable[[], None] | None) -> Iterator[None]:
    """Run ``work`` in a thread while the block runs; its error, if any, is raised at the end."""
    if work is None:
        yield
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-wheelhouse") as pool:
        started = pool.submit(work)
        yield
        started.result()


def _build_image(
    runtime: DockerRuntime,
    log: Log,
    output: Log | None,
    *,
    tag: str,
    suite: str,
    dockerfile: str,
    wheels: Callable[[], None] | None,
    base_turn: AbstractContextManager[None],
) -> str:
    """One image's chain: its base and its wheelhouse (at once: one waits on apt, the other on PyPI), then its build.

    The base is made in ``base_turn`` (``build_all``'s order: two debootstraps at once on two cores end
    together, as late as one after the other, so the first in line gets its base, and its build, sooner).
    """
    root = repo_root()
    with _alongside(wheels), base_turn:
        base = ensure_base_image(runtime, log, suite)
    log(f"building {tag} on {base}")
    runtime.build(root, dockerfile, tag, {"BASE_IMAGE": base}, output or log)
    return tag


def build_desktop(
    runtime: DockerRuntime,
    log: Log,
    *,
    tag: str = DESKTOP_IMAGE,
    wheelhouse: bool = True,
    output: Log | None = None,
    base_turn: AbstractContextManager[None] | None = None,
) -> str:
    """Build ``corral-desktop`` from images/desktop/Dockerfile; ``output`` gets the builder's lines (``log``'s).

    Layers are ordered so that a code change rebuilds only the last one (seconds).
    """
    arch = runtime.architecture
    wheels = (lambda: build_wheelhouse(repo_root(), arch, log)) if _wants_wheelhouse(wheelhouse) else None
    return _build_image(
        runtime,
        log,
        output,
        tag=tag,
        suite=DEBIAN_SUITE,
        dockerfile="images/desktop/Dockerfile",
        wheels=wheels,
        base_turn=base_turn or nullcontext(),
    )


def build_egress(
    runtime: DockerRuntime,
    log: Log,
    *,
    tag: str = EGRESS_IMAGE,
    wheelhouse: bool = True,
    output: Log | None = None,
    base_turn: AbstractContextManager[None] | None = None,
) -> str:
    """Build ``corral-egress`` (the per-session mitmproxy sidecar) from proxy/Dockerfile."""
    arch = runtime.architecture
    wheels = (
        (lambda: build_wheelhouse(repo_root(), arch, log, "proxy", "3.13")) if _wants_wheelhouse(wheelhouse) else None
    )
    return _build_image(
        runtime,
        log,
        output,
        tag=tag,
        suite=EGRESS_SUITE,
        dockerfile="proxy/Dockerfile",
        wheels=wheels,
        base_turn=base_turn or nullcontext(),
    )


Builder = Callable[..., str]
# The order bases are made in: the desktop's chain first, as its build is the longer (apt installs Chromium,
# fonts and the agent's toolset: about 80 s against the sidecar's 15 s).
BUILDS: dict[str, Builder] = {"desktop": build_desktop, "egress": build_egress}


class Turns:
    """One at a time, in a set order: ``turn(name)`` waits for the names before it to have had theirs."""

    def __init__(self, order: Sequence[str]) -> None:
        self._waiting = list(order)
        self._changed = threading.Condition()

    @contextmanager
    def turn(self, name: str, waiting: Callable[[str], None] | None = None) -> Iterator[None]:
        """``name``'s turn; ``waiting`` is told whose turn it is first, when ``name`` has to wait."""
        with self._changed:
            if self._waiting[0] != name and waiting is not None:
                waiting(self._waiting[0])
            self._changed.wait_for(lambda: self._waiting[0] == name)
        try:
            yield
        finally:
            self.skip(name)

    def skip(self, name: str) -> None:
        """End ``name``'s turn, or give it up if it has not had it (nothing when it has)."""
        with self._changed:
            if name in self._waiting:
                self._waiting.remove(name)
                self._changed.notify_all()


def build_jobs() -> int:
    """How many images build at once: ``$CORRAL_BUILD_JOBS`` (1: one after the other), both by default."""
    try:
        return max(1, int(os.environ.get("CORRAL_BUILD_JOBS") or len(BUILDS)))
    except ValueError:
        raise ImageBuildError("CORRAL_BUILD_JOBS must be a whole number") from None


def _build_one(runtime: DockerRuntime, build: Builder, task: BuildTask, turns: Turns, name: str) -> str:
    def waiting(first: str) -> None:
        task.step(f"waiting for {first}'s base (one debootstrap at a time)")

    try:
        tag = build(runtime, task.step, output=task.output, base_turn=turns.turn(name, waiting))
    finally:
        turns.skip(name)  # a chain that failed before its base's turn must not hold the others up
    task.done(f"built {tag}")
    return tag


def build_all(runtime: DockerRuntime, task: Callable[[str], BuildTask], jobs: int | None = None) -> list[str]:
    """Build every image (``jobs`` at once, ``build_jobs()`` by default), each reporting to ``task(name)``.

    Both builds run to their end even when one fails (a build the engine runs cannot be called
    back half-way); then the first failure is raised, naming every one that failed.
    """
    turns = Turns(list(BUILDS))
    with ThreadPoolExecutor(max_workers=jobs or build_jobs(), thread_name_prefix="corral-build") as pool:
        started: dict[str, Future[str]] = {
            name: pool.submit(_build_one, runtime, build, task(name), turns, name) for name, build in BUILDS.items()
        }
    failed = {name: future.exception() for name, future in started.items() if future.exception() is not None}
    if failed:
        raise ImageBuildError("\n".join(f"{name}: {error}" for name, error in failed.items()))
    return [future.result() for future in started.values()]
