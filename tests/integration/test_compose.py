"""The README's main job: `corral up` starts the gateway through docker compose; then a session works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from corral import Sandbox, images

from .dockerutil import DockerHarness
from .gateway_fixtures import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


def _corral(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_corral_up_status_session_down(runtime: DockerHarness) -> None:
    if runtime.find("corral-gateway") is not None or any(
        c for c in runtime.list_sandboxes({"corral.gateway": "default"})
    ):
        pytest.skip("a corral gateway already runs on this machine; not touching it")
    port = free_port()
    instance = f"compose-{time.time_ns()}"
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_API_KEY"}
    env.update(CORRAL_PORT=str(port), CORRAL_INSTANCE=instance, CORRAL_POOL_SIZE="0")
    try:
        up = _corral(["up", "--no-build"], env)
        assert up.returncode == 0, up.stderr
        status = _corral(["status", "--json"], env)
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["health"]["ok"] is True and info["health"]["host_guard"] is True
        assert info["api_key"].startswith("crl_")  # generated on first start, kept in the data volume
        # The gateway runs the tags the build made ($CORRAL_IMAGE), and hands its sandboxes the same ones.
        gateway = docker.from_env().containers.get("corral-gateway")
        assert images.DESKTOP_IMAGE in gateway.image.tags
        assert {f"CORRAL_IMAGE={images.DESKTOP_IMAGE}", f"CORRAL_EGRESS_IMAGE={images.EGRESS_IMAGE}"} <= set(
            gateway.attrs["Config"]["Env"]
        )
        with Sandbox.create(url=f"http://127.0.0.1:{port}", api_key=info["api_key"]) as sb:
            assert sb.screenshot("jpeg")[:3] == b"\xff\xd8\xff"
    finally:
        down = _corral(["down"], env)
        runtime.remove_all({"corral.gateway": instance})
    assert down.returncode == 0, down.stderr
    assert runtime.find("corral-gateway") is None
