"""corral.images: the images built side by side, a failure named after both ended, bases under a configurable name."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from corral import images
from corral.errors import ImageBuildError


class Task:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def step(self, text: str) -> None:
        self.log.append(f"{self.name} step {text}")

    def output(self, line: str) -> None:
        self.log.append(f"{self.name} output {line}")

    def done(self, text: str) -> None:
        self.log.append(f"{self.name} done {text}")


def _tasks(log: list[str]) -> Any:
    return lambda name: Task(name, log)


def test_the_two_images_build_at_the_same_time(monkeypatch: pytest.MonkeyPatch) -> None:
    both_running = threading.Barrier(2, timeout=5)

    def builder(tag: str) -> images.Builder:
        def build(runtime: object, log: images.Log, *, output: images.Log, base_turn: Any) -> str:
            log(f"building {tag}")
            both_running.wait()  # broken (an error) unless the other build is under way too
            output("Step 1/1 : FROM base")
            return tag

        return build

    monkeypatch.setattr(images, "BUILDS", {"desktop": builder("d:1"), "egress": builder("e:1")})
    log: list[str] = []
    assert images.build_all(object(), _tasks(log)) == ["d:1", "e:1"]  # type: ignore[arg-type]
    assert {"desktop done built d:1", "egress done built e:1", "desktop output Step 1/1 : FROM base"} <= set(log)


def test_one_at_a_time_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def build(runtime: object, log: images.Log, *, output: images.Log, base_turn: Any) -> str:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        with lock:
            running -= 1
        return "t"

    monkeypatch.setattr(images, "BUILDS", {"desktop": build, "egress": build})
    monkeypatch.setenv("CORRAL_BUILD_JOBS", "1")
    images.build_all(object(), _tasks([]))  # type: ignore[arg-type]
    assert most == 1


def test_a_failed_build_lets_the_other_finish_and_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(runtime: object, log: images.Log, *, output: images.Log, base_turn: Any) -> str:
        raise ImageBuildError("debootstrap failed (1)")

    def builds(runtime: object, log: images.Log, *, output: images.Log, base_turn: Any) -> str:
        return "e:1"

    monkeypatch.setattr(images, "BUILDS", {"desktop": fails, "egress": builds})
    log: list[str] = []
    with pytest.raises(ImageBuildError, match=r"^desktop: debootstrap failed \(1\)$"):
        images.build_all(object(), _tasks(log))  # type: ignore[arg-type]
    assert log == ["egress done built e:1"]


def test_the_desktops_base_is_made_first_even_when_the_egress_chain_gets_there_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    egress_arrived = threading.Event()
    order: list[str] = []

    def desktop(runtime: object, log: images.Log, *, output: images.Log, base_turn: Any) -> str:
        assert egress_arrived.wait(5)
        with base_turn:
            order.append("desktop base")
        return "d:1"

    def egress(runtime: object, log: images.Log, *, output: images.Log, base_turn: Any) -> str:
        egress_arrived.set()
        with base_turn:
            order.append("egress base")
        return "e:1"

    monkeypatch.setattr(images, "BUILDS", {"desktop": desktop, "egress": egress})
    log: list[str] = []
    assert images.build_all(object(), _tasks(log)) == ["d:1", "e:1"]  # type: ignore[arg-type]
    assert order == ["desktop base", "egress base"]
    assert "egress step waiting for desktop's base (one debootstrap at a time)" in log


def test_a_chain_that_fails_before_its_turn_does_not_hold_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def desktop(runtime: object, log: images.Log, *, output: images.Log, base_turn: Any) -> str:
        raise ImageBuildError("pip download failed")

    def egress(runtime: object, log: images.Log, *, output: images.Log, base_turn: Any) -> str:
        with base_turn:
            return "e:1"

    monkeypatch.setattr(images, "BUILDS", {"desktop": desktop, "egress": egress})
    log: list[str] = []
    with pytest.raises(ImageBuildError, match="desktop: pip download failed"):
        images.build_all(object(), _tasks(log))  # type: ignore[arg-type]
    assert log == ["egress done built e:1"]


def test_build_jobs_must_be_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_BUILD_JOBS", "two")
    with pytest.raises(ImageBuildError, match="CORRAL_BUILD_JOBS"):
        images.build_jobs()
    monkeypatch.delenv("CORRAL_BUILD_JOBS")
    assert images.build_jobs() == 2


def test_made_bases_go_under_the_configured_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    assert images.local_base("bookworm") == f"{images.BASE_REPOSITORY}:bookworm"
    monkeypatch.setattr(images, "BASE_REPOSITORY", "corral-base-bench")
    assert images.local_base("trixie") == "corral-base-bench:trixie"


class FakeRuntime:
    """Only a made base, under the configured name: the build goes on it, never on a shared one."""

    architecture = "x86_64"

    def __init__(self, present: set[str]) -> None:
        self.present = present
        self.built: list[tuple[str, dict[str, str]]] = []

    def image_exists(self, name: str) -> bool:
        return name in self.present

    def try_pull(self, name: str) -> bool:
        return False

    def build(self, context: object, dockerfile: str, tag: str, buildargs: dict[str, str], sink: images.Log) -> None:
        sink("Step 1/1 : FROM x")
        self.built.append((tag, buildargs))


def test_a_build_uses_the_base_under_its_own_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "BASE_REPOSITORY", "corral-base-bench")
    monkeypatch.delenv("CORRAL_EGRESS_BASE_IMAGE", raising=False)
    runtime = FakeRuntime({"corral-base-bench:trixie", "corral-base:trixie"})
    steps: list[str] = []
    outputs: list[str] = []
    tag = images.build_egress(
        runtime,  # type: ignore[arg-type]
        steps.append,
        tag="corral-egress:bench",
        wheelhouse=False,
        output=outputs.append,
    )
    assert tag == "corral-egress:bench"
    assert runtime.built == [("corral-egress:bench", {"BASE_IMAGE": "corral-base-bench:trixie"})]
    assert steps == ["building corral-egress:bench on corral-base-bench:trixie"]
    assert outputs == ["Step 1/1 : FROM x"]


def test_a_made_base_installs_without_fsync_and_without_translations(tmp_path: Path) -> None:
    rootfs = tmp_path
    images._speed_up_apt(rootfs)
    assert (rootfs / "etc/dpkg/dpkg.cfg.d/docker-apt-speedup").read_text() == "force-unsafe-io\n"
    assert (rootfs / "etc/apt/apt.conf.d/docker-no-languages").read_text() == 'Acquire::Languages "none";\n'
