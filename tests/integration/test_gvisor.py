"""The sandbox under gVisor (runsc): why Corral does not offer it (docs/gvisor.md).

runsc 20221219 (Debian's) with ``--network=host`` gives the sandbox no iptables and no ambient
capabilities. These tests pin down that Corral then fails closed where it must (a sandbox with
egress control never runs without its firewall) and that the runtime says why. They skip unless
dockerd has a runtime called ``runsc``.
"""

from __future__ import annotations

import os

import docker
import pytest

from corral.errors import SandboxError
from corral.runtime import SandboxSpec

from .dockerutil import DockerHarness


@pytest.fixture(scope="module")
def runsc(runtime: DockerHarness) -> str:
    registered = docker.from_env().info().get("Runtimes") or {}
    if "runsc" not in registered:
        pytest.skip("runsc (gVisor) is not registered with dockerd: see docs/gvisor.md for daemon.json")
    return "runsc"


def test_egress_sandbox_under_runsc_refuses_to_start_without_its_firewall(
    runtime: DockerHarness, desktop_image: str, runsc: str
) -> None:
    """With a proxy, boot must set the firewall or not start: under runsc iptables-restore fails, so
    the sandbox exits before its controller or Chromium run, and start_sandbox reports boot's reason.
    The addresses are never dialled: boot stops at the firewall."""
    name = f"corral-gvisor-it-egress-{os.getpid()}"
    runtime.remove(name)
    spec = SandboxSpec(
        image=desktop_image,
        name=name,
        runtime=runsc,
        labels={"corral.test": "1"},
        environment={
            "CORRAL_PROXY": "10.213.255.2:8080",
            "CORRAL_SESSION_NET": "10.213.255.0/28",
            "CORRAL_SESSION_GATEWAY": "10.213.255.1",
        },
    )
    try:
        with pytest.raises(SandboxError) as raised:
            runtime.start_sandbox(spec)
        assert "refusing to start" in str(raised.value)
        assert "iptables-restore failed" in str(raised.value)
        assert runtime.find(name) is None  # removed, not left behind
    finally:
        runtime.remove(name)


def test_plain_sandbox_under_runsc_refuses_to_run_without_the_inner_boundary(
    runtime: DockerHarness, desktop_image: str, runsc: str
) -> None:
    """Without a proxy either, the agent's uid cannot be fenced off the controller under runsc (no
    owner-match firewall; no ambient capabilities for the uid split): a sandbox Corral starts refuses
    to run rather than run without its inner boundary. This is why CORRAL_SANDBOX_RUNTIME is not offered."""
    name = f"corral-gvisor-it-plain-{os.getpid()}"
    runtime.remove(name)
    spec = SandboxSpec(image=desktop_image, name=name, runtime=runsc, labels={"corral.test": "1"})
    try:
        with pytest.raises(SandboxError) as raised:
            runtime.wait_ready(runtime.start_sandbox(spec), timeout_s=120)
        assert "refusing to start" in str(raised.value), raised.value
        assert "cannot be kept off the controller" in str(raised.value), raised.value
    finally:
        runtime.remove(name)
