"""corral.progress: plain lines off a terminal (every step, a heartbeat after quiet), one status line on it."""

from __future__ import annotations

import threading

from corral.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Status:
    def __init__(self) -> None:
        self.shown: list[str] = []

    def update(self, status: str) -> None:
        self.shown.append(status)


def _plain(interval_s: float = 9.0) -> tuple[Progress, list[str], Clock]:
    clock, written = Clock(), []
    return Progress(written.append, interval_s=interval_s, clock=clock), written, clock


def test_each_step_and_each_dockerfile_step_is_a_line_with_its_time_and_task() -> None:
    progress, written, clock = _plain()
    desktop = progress.task("desktop")
    desktop.step("debootstrap bookworm")
    clock.now += 42
    desktop.output("Step 4/22 : RUN apt-get update")
    desktop.output("Get:1 http://deb.debian.org/debian bookworm InRelease")
    desktop.done("built corral-desktop:latest")
    assert written == [
        "[    0 s] desktop: debootstrap bookworm",
        "[   42 s] desktop: Step 4/22 : RUN apt-get update",
        "[   42 s] desktop: built corral-desktop:latest",
    ]


def test_a_task_quiet_for_the_interval_gets_a_line_with_its_step_and_last_output() -> None:
    progress, written, clock = _plain()
    egress = progress.task("egress")
    egress.output("Step 4/14 : RUN apt-get install python3")
    egress.output("Unpacking python3.13 ...")
    clock.now += 8.9
    progress.beat()
    assert len(written) == 1  # not yet quiet for 9 s
    clock.now += 0.1
    progress.beat()
    assert written[-1] == (
        "[    9 s] egress: still at Step 4/14 : RUN apt-get install python3: 9 s in (last: Unpacking python3.13 ...)"
    )
    progress.beat()
    assert len(written) == 2  # the heartbeat itself counts as a line


def test_a_finished_task_gets_no_heartbeat() -> None:
    progress, written, clock = _plain()
    progress.task("egress").done("built corral-egress:latest")
    clock.now += 60
    progress.beat()
    assert written == ["[    0 s] egress: built corral-egress:latest"]


def test_on_a_terminal_the_status_line_shows_every_running_task_and_nothing_is_written() -> None:
    clock, written, status = Clock(), [], Status()
    progress = Progress(written.append, status=status, clock=clock)
    desktop, egress = progress.task("desktop"), progress.task("egress")
    desktop.output("Step 2/22 : FROM corral-base:bookworm")
    egress.step("debootstrap trixie")
    clock.now += 60
    progress.beat()
    egress.done("built corral-egress:latest")
    assert status.shown[-2] == "desktop: Step 2/22 : FROM corral-base:bookworm | egress: debootstrap trixie"
    assert status.shown[-1] == "desktop: Step 2/22 : FROM corral-base:bookworm"
    assert written == []


def test_the_heartbeat_thread_writes_while_a_task_is_quiet_and_stops_with_the_block() -> None:
    spoke = threading.Event()
    written: list[str] = []

    def write(line: str) -> None:
        written.append(line)
        if "still at" in line:
            spoke.set()

    with Progress(write, interval_s=0.01) as progress:
        progress.task("desktop").step("debootstrap bookworm")
        assert spoke.wait(5)
    assert "progress-heartbeat" not in {thread.name for thread in threading.enumerate()}
