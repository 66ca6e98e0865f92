"""The README's main job: `corral up` starts the gateway through docker compose; then a session works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import docker
import httpx
import pytest

from corral import Sandbox, images

from .dockerutil import DockerHarness
from .egress_fixtures import write_test_pki
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


def test_corral_up_hands_an_env_files_settings_to_the_gateway(runtime: DockerHarness, tmp_path: Path) -> None:
    """Settings compose.yaml never passed reach the gateway from an env file, and it honours them: its
    data dir, a body cap, and an upstream CA (a file setting) it reads through its read-only mount."""
    if runtime.find("corral-gateway") is not None or any(
        c for c in runtime.list_sandboxes({"corral.gateway": "default"})
    ):
        pytest.skip("a corral gateway already runs on this machine; not touching it")
    port = free_port()
    instance = f"envfile-{time.time_ns()}"
    data = tmp_path / "data"
    ca_path, _, _ = write_test_pki(tmp_path / "pki")
    settings = tmp_path / "gateway.env"
    settings.write_text(
        "\n".join(
            [
                "# the test's gateway",
                f"CORRAL_PORT={port}",
                f"CORRAL_INSTANCE={instance}",
                f"CORRAL_DATA_DIR={data}",
                "CORRAL_POOL_SIZE=0",
                "CORRAL_GROUND_POOL_SIZE=1  # one ground made ahead, without its proxy",
                "CORRAL_GROUND_PROXIES=false",
                "CORRAL_MAX_BODY_KB=1",
                "CORRAL_EGRESS_UPSTREAM_CA=pki/ca.pem  # relative to this file",
            ]
        )
    )
    settings.chmod(0o600)
    # The file's values, not the shell's: the shell wins where it sets a name too.
    shadowing = {
        "CORRAL_API_KEY",
        "CORRAL_URL",
        "CORRAL_PORT",
        "CORRAL_INSTANCE",
        "CORRAL_DATA_DIR",
        "CORRAL_POOL_SIZE",
    }
    env = {k: v for k, v in os.environ.items() if k not in shadowing}
    try:
        up = _corral(["up", "--no-build", "--env-file", str(settings)], env)
        assert up.returncode == 0, up.stderr
        key = (data / "api_key").read_text().strip()  # generated in the env file's data dir
        gateway = docker.from_env().containers.get("corral-gateway")
        assert "CORRAL_EGRESS_UPSTREAM_CA=/run/corral/settings/egress_upstream_ca" in gateway.attrs["Config"]["Env"]
        (mount,) = [m for m in gateway.attrs["Mounts"] if m["Destination"] == "/run/corral/settings/egress_upstream_ca"]
        assert mount["Source"] == str(ca_path.resolve()) and mount["RW"] is False
        # The ground made ahead holds the upstream CA the gateway read from its mount.
        deadline = time.monotonic() + 60
        while not (copies := list((data / "egress").glob("ses_*/upstream-ca.pem"))):
            assert time.monotonic() < deadline, runtime.logs("corral-gateway", 50)
            time.sleep(0.2)
        assert copies[0].read_bytes() == ca_path.read_bytes()
        # CORRAL_MAX_BODY_KB=1: a 2 KiB create body is refused unread.
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"}) as client:
            refused = client.post("/v1/sessions", content=json.dumps({"pad": "x" * 2048}))
        assert refused.status_code == 413 and refused.json()["error"]["code"] == "message_too_large"
    finally:
        down = _corral(["down", "--env-file", str(settings)], env)
        runtime.remove_all({"corral.gateway": instance})
    assert down.returncode == 0, down.stderr
    assert runtime.find("corral-gateway") is None
