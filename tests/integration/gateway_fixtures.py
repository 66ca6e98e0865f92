"""A real gateway (uvicorn in a thread) over the real Docker engine, for the control-plane tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.gateway.server import build_app, running
from corral.gateway.settings import GatewaySettings
from corral.recording.bundle import Bundle, read_bundle
from corral.runtime import SandboxRuntime

from .dockerutil import DockerHarness

KEY_A = "test-key-a-N4q7Rz2Lw9Xc5Vb8Tm3Kp6Hd"  # strong enough for the gateway to hold (keystrength)
KEY_B = "test-key-b-F2j8Ws5Qy1Ge7Uo4Ia9Zt3Lr"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RunningGateway:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.url = f"http://127.0.0.1:{settings.port}"
        self.ws = self.url.replace("http://", "ws://")

    def client(self, key: str | None = KEY_A) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def wait_pool(self, ready: int, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        with self.client(None) as c:
            while c.get("/v1/health").json()["sessions"]["pool"] < ready:
                assert time.monotonic() < deadline, "the pool did not fill"
                time.sleep(0.2)


@contextmanager
def gateway(
    data_dir: Path, instance: str, runtime: SandboxRuntime | None = None, **overrides: object
) -> Iterator[RunningGateway]:
    """Serve a gateway until the block ends; its sandboxes stay up (as after a real restart).
    ``runtime``: the one it runs on (default: the driver its settings name)."""
    values: dict[str, object] = {
        "port": free_port(),
        "preview_port": free_port(),  # gateways side by side each have their own preview listener
        "data_dir": data_dir,
        "api_key": f"{KEY_A},{KEY_B}",
        "instance": instance,
        "pool_size": 0,
        "reap_interval_s": 0.25,
        "max_sessions": 12,
        "max_sessions_per_key": 10,
        "network": f"corral-test-{os.getpid()}",
        "egress_network": f"corral-egress-test-{os.getpid()}",
    }
    values.update(overrides)
    settings = GatewaySettings(**values)  # type: ignore[arg-type]
    with running(settings, app=build_app(settings, runtime) if runtime is not None else None):
        yield RunningGateway(settings)


@contextmanager
def module_gateway(
    tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness, prefix: str, **overrides: object
) -> Iterator[RunningGateway]:
    """A test module's gateway (instance ``prefix``-<ns>); after it, what it started is removed
    (sandboxes, proxies, session networks)."""
    instance = f"{prefix}-{time.time_ns()}"
    with gateway(tmp_path_factory.mktemp("gw"), instance, **overrides) as served:
        yield served
    runtime.remove_all({"corral.gateway": instance})


def unpack_recording(
    gw: RunningGateway, session_id: str, target: Path, ready: Callable[[Bundle], bool] | None = None
) -> Path:
    """The session's recording, downloaded into ``target`` and unpacked: its directory. With
    ``ready``, downloaded again until the bundle satisfies it (the recorder catches up after the end)."""
    deadline = time.monotonic() + 15
    while True:
        with gw.client(KEY_A) as c:
            response = c.get(f"/v1/sessions/{session_id}/recording")
        assert response.status_code == 200, response.text
        (target / "bundle.zip").write_bytes(response.content)
        with zipfile.ZipFile(target / "bundle.zip") as archive:
            archive.extractall(target)
        if ready is None or ready(read_bundle(target / session_id)):
            return target / session_id
        assert time.monotonic() < deadline, "the recording did not catch up"
        time.sleep(0.2)


def traffic(gw: RunningGateway, session_id: str, **params: str) -> list[dict[str, Any]]:
    """The session's traffic log (``params``: its filters), one record a line."""
    with gw.client() as c:
        response = c.get(f"/v1/sessions/{session_id}/traffic", params=params)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line]


def replay_cli(gw: RunningGateway, bundle: Path, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    """``corral replay`` of ``bundle`` against the gateway: its exit code, its JUnit XML and its HTML
    report (each the command's output when it wrote none)."""
    junit, report = tmp_path / "junit.xml", tmp_path / "report.html"
    outputs = ["--junit", str(junit), "--report", str(report)]
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "replay", str(bundle), "--against", gw.url, *outputs, *extra],
        env={**os.environ, "CORRAL_API_KEY": KEY_A},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = done.stdout + done.stderr
    return (
        done.returncode,
        junit.read_text() if junit.exists() else output,
        report.read_text() if report.exists() else output,
    )
