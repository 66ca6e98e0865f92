"""The runtime's reads inside a container are bounded: an exec that never answers (seen under runsc,
into a container that was exiting) becomes a SandboxError, not a hang. The Docker client is faked at
its narrowest seam (``containers.get`` and ``exec_run``); the real path runs in the integration tests."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from corral.errors import SandboxError
from corral.runtime import SandboxAddress
from corral.runtime.docker import DockerRuntime


class HangingContainer:
    status = "running"

    def __init__(self, release: threading.Event) -> None:
        self._release = release

    def exec_run(self, argv: list[str], **_: Any) -> tuple[int, bytes]:
        self._release.wait()
        return 0, b"late"

    def logs(self, tail: int = 100) -> bytes:
        return b"boot: still starting\n"


class AnsweringContainer(HangingContainer):
    def exec_run(self, argv: list[str], **_: Any) -> tuple[int, bytes]:
        return 0, b"s3cret\n"


class FakeContainers:
    def __init__(self, container: HangingContainer) -> None:
        self._container = container

    def get(self, ident: str) -> HangingContainer:
        return self._container


class FakeClient:
    def __init__(self, container: HangingContainer) -> None:
        self.containers = FakeContainers(container)

    def ping(self) -> bool:
        return True


def runtime_with(container: HangingContainer) -> DockerRuntime:
    return DockerRuntime(FakeClient(container))  # the seam under test: docker-py is untyped


ADDRESS = SandboxAddress("c0ffee", "corral-test", "127.0.0.1", 8765)


def test_an_exec_that_never_answers_is_a_sandbox_error_within_the_wait() -> None:
    release = threading.Event()
    runtime = runtime_with(HangingContainer(release))
    started = time.monotonic()
    try:
        with pytest.raises(SandboxError, match="did not answer an exec") as raised:
            runtime._with_secret(ADDRESS, wait_s=0.3)
    finally:
        release.set()  # as removing the container would
    assert time.monotonic() - started < 5
    assert "boot: still starting" in str(raised.value)  # the container's own account


def test_the_secret_is_read_when_the_exec_answers() -> None:
    found = runtime_with(AnsweringContainer(threading.Event()))._with_secret(ADDRESS, wait_s=1)
    assert found.secret == "s3cret"
    assert (found.id, found.host, found.port) == (ADDRESS.id, ADDRESS.host, ADDRESS.port)
