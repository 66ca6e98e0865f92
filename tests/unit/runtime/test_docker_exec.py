"""The runtime's reads inside a container are bounded: an exec that never answers (seen under runsc,
into a container that was exiting) becomes a SandboxError, not a hang; and the secret is read once,
when boot's log says it is written, not polled for with execs that fail while boot runs. The Docker
client is faked at its narrowest seam (``containers.get``, ``exec_run`` and a followed ``logs``); the
real path runs in the integration tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest
import requests

from corral.errors import SandboxError
from corral.runtime import SandboxAddress
from corral.runtime.docker import DockerRuntime


class HangingContainer:
    status = "running"

    def __init__(self, release: threading.Event) -> None:
        self._release = release
        self.execs = 0

    def exec_run(self, argv: list[str], **_: Any) -> tuple[int, bytes]:
        self._release.wait()
        return 0, b"late"

    def logs(self, tail: int = 100) -> bytes:
        return b"boot: still starting\n"


class AnsweringContainer(HangingContainer):
    def exec_run(self, argv: list[str], **_: Any) -> tuple[int, bytes]:
        return 0, b"s3cret\n"


class BootingContainer(HangingContainer):
    """Its secret exists once its followed log has said so; every exec is counted."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__(release)
        self.written = threading.Event()

    def exec_run(self, argv: list[str], **_: Any) -> tuple[int, bytes]:
        self.execs += 1
        return (0, b"s3cret\n") if self.written.is_set() else (1, b"")


class FollowedLog:
    """``logs(stream=True, follow=True)``: yields ``chunks`` (calling ``before`` ahead of each), then
    blocks as a live container's log does until closed, or ends when ``ends``."""

    def __init__(self, chunks: list[bytes], before: list[threading.Event] | None = None, ends: bool = False) -> None:
        self._chunks, self._before, self._ends = chunks, before or [], ends
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        for index, chunk in enumerate(self._chunks):
            if index < len(self._before):
                self._before[index].set()
            yield chunk
        if not self._ends:
            self.closed.wait()
            raise OSError("closed")  # as docker-py's stream does when closed under its reader

    def close(self) -> None:
        self.closed.set()


class FakeContainers:
    def __init__(self, container: HangingContainer) -> None:
        self._container = container

    def get(self, ident: str) -> HangingContainer:
        return self._container


class FakeApi:
    def __init__(self, log: FollowedLog) -> None:
        self.log = log
        self.follows = 0

    def logs(self, ident: str, stream: bool = False, follow: bool = False) -> FollowedLog:
        assert stream and follow
        self.follows += 1
        return self.log


class RefusingApi(FakeApi):
    """A daemon that will not follow the log: one that refuses, or one gone (requests' own error)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(FollowedLog([]))
        self.error = error

    def logs(self, ident: str, stream: bool = False, follow: bool = False) -> FollowedLog:
        raise self.error


class HangingApi(FakeApi):
    """A daemon that answers the follow only when ``release`` is set."""

    def __init__(self, log: FollowedLog, release: threading.Event) -> None:
        super().__init__(log)
        self.release = release

    def logs(self, ident: str, stream: bool = False, follow: bool = False) -> FollowedLog:
        self.release.wait()
        return self.log


class ClosingRaises(FollowedLog):
    def close(self) -> None:
        super().close()
        raise docker.errors.DockerException("ssh connections cannot be shut down this way")


class FakeClient:
    def __init__(self, container: HangingContainer, log: FollowedLog, api: FakeApi | None = None) -> None:
        self.containers = FakeContainers(container)
        self.api = api or FakeApi(log)

    def ping(self) -> bool:
        return True

    def info(self) -> dict[str, Any]:
        return {"SecurityOptions": ["name=seccomp,profile=default"], "DockerRootDir": "/var/lib/docker"}


def runtime_with(
    container: HangingContainer, log: FollowedLog | None = None, api: FakeApi | None = None
) -> DockerRuntime:
    log = log or FollowedLog([b"INFO corral.boot: controller secret written\n"])
    return DockerRuntime(FakeClient(container, log, api))  # the seam under test: docker-py is untyped


ADDRESS = SandboxAddress("c0ffee", "corral-test", "127.0.0.1", 8765)


def test_an_exec_that_never_answers_is_a_sandbox_error_within_the_wait() -> None:
    release = threading.Event()
    runtime = runtime_with(HangingContainer(release))
    started = time.monotonic()
    try:
        with pytest.raises(SandboxError, match="did not answer an exec") as raised:
            runtime.read_secret(ADDRESS, wait_s=0.3)
    finally:
        release.set()  # as removing the container would
    assert time.monotonic() - started < 5
    assert "boot: still starting" in str(raised.value)  # the container's own account


def test_the_secret_is_read_when_the_exec_answers() -> None:
    found = runtime_with(AnsweringContainer(threading.Event())).read_secret(ADDRESS, wait_s=1)
    assert found.secret == "s3cret"
    assert (found.id, found.host, found.port) == (ADDRESS.id, ADDRESS.host, ADDRESS.port)


def test_the_secret_is_read_by_one_exec_once_boot_logs_it_is_written() -> None:
    container = BootingContainer(threading.Event())
    # Boot's lines as Docker hands them over: the mark split across two chunks, the file written
    # just before its line (write_secret returns before the log call).
    log = FollowedLog(
        [b"INFO corral.boot: egress locked\nINFO corral.boot: controller sec", b"ret written\n"],
        before=[threading.Event(), container.written],
    )
    found = runtime_with(container, log).read_secret(ADDRESS, wait_s=5)
    assert (found.secret, container.execs) == ("s3cret", 1)
    assert log.closed.is_set()  # the follow is not left open


def test_an_image_whose_boot_does_not_say_so_is_read_once_its_init_logs() -> None:
    container = BootingContainer(threading.Event())
    log = FollowedLog(
        [b"INFO corral.boot: egress locked\n", b"INFO corral.init: Xvfb ready on :0\n"],
        before=[threading.Event(), container.written],
    )
    assert runtime_with(container, log).read_secret(ADDRESS, wait_s=5).secret == "s3cret"
    assert container.execs == 1


def test_a_log_that_ends_or_says_nothing_in_time_is_no_mark_and_the_follow_is_closed() -> None:
    ended = FollowedLog([b"ERROR corral.boot: cannot lock the sandbox down\n"], ends=True)
    runtime = runtime_with(AnsweringContainer(threading.Event()), ended)
    assert runtime.wait_for_log(ADDRESS.id, (b"controller secret written",), 5) is False
    silent = FollowedLog([b"INFO corral.boot: egress locked\n"])
    runtime = runtime_with(AnsweringContainer(threading.Event()), silent)
    started = time.monotonic()
    assert runtime.wait_for_log(ADDRESS.id, (b"controller secret written",), 0.3) is False
    assert 0.25 < time.monotonic() - started < 2
    assert silent.closed.is_set()


def test_without_boots_mark_the_secret_is_still_found_by_retrying() -> None:
    container = BootingContainer(threading.Event())
    container.written.set()  # written, but the log never says so (a follow the daemon refused)
    log = FollowedLog([], ends=True)
    assert runtime_with(container, log).read_secret(ADDRESS, wait_s=2).secret == "s3cret"


@pytest.mark.parametrize(
    "error", [docker.errors.APIError("500 Server Error"), requests.exceptions.ConnectionError("daemon gone")]
)
def test_a_daemon_that_will_not_follow_the_log_is_no_hint_and_the_secret_is_still_read(error: Exception) -> None:
    container = BootingContainer(threading.Event())
    container.written.set()
    runtime = runtime_with(container, api=RefusingApi(error))
    started = time.monotonic()
    assert runtime.read_secret(ADDRESS, wait_s=5).secret == "s3cret"
    assert time.monotonic() - started < 2


def test_a_follow_that_hangs_is_bounded_by_the_wait_and_closed_once_it_answers() -> None:
    release = threading.Event()
    log = FollowedLog([b"INFO corral.boot: controller secret written\n"])
    runtime = runtime_with(AnsweringContainer(threading.Event()), api=HangingApi(log, release))
    started = time.monotonic()
    assert runtime.wait_for_log(ADDRESS.id, (b"controller secret written",), 0.3) is False
    assert time.monotonic() - started < 2
    release.set()  # the daemon answers after the caller gave up: what it opened is closed
    assert log.closed.wait(2)


def test_a_close_that_raises_is_not_the_callers_failure() -> None:
    log = ClosingRaises([b"INFO corral.boot: controller secret written\n"])
    found = runtime_with(AnsweringContainer(threading.Event()), log).read_secret(ADDRESS, wait_s=5)
    assert found.secret == "s3cret" and log.closed.is_set()


def test_a_read_with_no_wait_follows_no_log() -> None:
    api = FakeApi(FollowedLog([]))
    assert (
        runtime_with(AnsweringContainer(threading.Event()), api=api).read_secret(ADDRESS, wait_s=0).secret == "s3cret"
    )
    assert api.follows == 0
