"""The swarm tests' world: a real swarm of three engines (scripts/swarm, its own name, net and veth
prefix), the images pushed to its registry and pulled on every node, a fake upstream as a service on
the egress overlay, and the gateway as a container on the manager (CORRAL_RUNTIME=swarm) reached at
127.0.0.1 through the swarm's relay. Up once per run, down at the end (nothing of it left).

They run only with ``CORRAL_SWARM_TESTS=1``, in one process (``-p no:xdist``): one swarm per run,
not one per worker, and the rest of the integration suite does not wait minutes for it (scripts/test
runs them as a step of their own). ``CORRAL_SWARM_KEEP=1`` leaves a swarm that is up as it is (a
developer's, reused; not taken down)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import httpx
import pytest

from corral import images

from ..egress_fixtures import UPSTREAM_NAMES, UPSTREAM_SCRIPTS, write_test_pki
from ..gateway_fixtures import free_port

ROOT = Path(__file__).resolve().parents[3]
SWARM = ROOT / "scripts" / "swarm"
EGRESS_NETWORK = "corral-egress"  # the gateway's default: its proxies' way out
UPSTREAM = "corral-swarm-upstream"
SETUP_TIMEOUT_S = 1500  # up with images (~3 min idle, over 5 loaded), the gateway, the upstream


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/swarm/" in str(item.fspath):
            item.add_marker(pytest.mark.swarm)  # scripts/test's swarm step selects them all by it
    if os.environ.get("CORRAL_SWARM_TESTS") == "1":
        # The first test's setup brings the swarm up with its images (minutes on a loaded host).
        for item in items:
            if "tests/integration/swarm/" in str(item.fspath):
                item.add_marker(pytest.mark.timeout(SETUP_TIMEOUT_S))
        return
    skip = pytest.mark.skip(
        reason="the swarm tests run with CORRAL_SWARM_TESTS=1 (a swarm of their own, minutes to start)"
    )
    for item in items:
        if "tests/integration/swarm/" in str(item.fspath):
            item.add_marker(skip)


@dataclass(frozen=True, slots=True)
class Swarm:
    """A swarm up with its gateway: where it answers, its key, and the manager's API."""

    env: dict[str, str]
    url: str
    api_key: str
    manager: docker.DockerClient
    upstream_address: str

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=180)

    def nodes(self) -> set[str]:
        return {str(node.attrs["Description"]["Hostname"]) for node in self.manager.nodes.list()}


def _swarm_env() -> dict[str, str]:
    """The run's own swarm: distinct from a developer's default one and from other helpers' swarms."""
    defaults = {
        "CORRAL_SWARM_NAME": "crl-t",
        "CORRAL_SWARM_NET": "10.239.0",
        "CORRAL_SWARM_DIR": "/var/lib/crl-t",
        "CORRAL_SWARM_VETH": "cst",
    }
    env = {**os.environ}
    for key, value in defaults.items():
        env.setdefault(key, value)
    env.setdefault("CORRAL_SWARM_PORT", str(free_port()))
    env.setdefault("CORRAL_IMAGE", images.DESKTOP_IMAGE)
    env.setdefault("CORRAL_EGRESS_IMAGE", images.EGRESS_IMAGE)
    return env


def _run(env: dict[str, str], *args: str, timeout: float = 600) -> str:
    done = subprocess.run([str(SWARM), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"scripts/swarm {' '.join(args)} failed:\n{done.stderr[-4000:]}"
    return done.stdout


def _start_upstream(manager: docker.DockerClient, directory: Path, image: str) -> tuple[str, Path]:
    """The fake upstream (tests/integration/upstream/server.py) as a service on the egress overlay,
    answering for the names under .test; pinned to the manager, whose files it is given (the test
    swarm's nodes share this machine's disk; only the upstream, a test's fixture, relies on it)."""
    ca_path, leaf, _ = write_test_pki(directory / "pki")
    for service in manager.services.list(filters={"name": UPSTREAM}):
        service.remove()
    mounts = [
        docker.types.Mount("/srv/server.py", str(UPSTREAM_SCRIPTS / "server.py"), type="bind", read_only=True),
        docker.types.Mount("/srv/pages", str(UPSTREAM_SCRIPTS / "pages"), type="bind", read_only=True),
        docker.types.Mount("/pki", str(leaf.parent), type="bind", read_only=True),
    ]
    manager.services.create(
        image,
        ["/opt/corral/bin/python", "/srv/server.py", "/pki/leaf.pem", "/pki/leaf.key"],
        name=UPSTREAM,
        mounts=mounts,
        networks=[docker.types.NetworkAttachmentConfig(EGRESS_NETWORK, aliases=UPSTREAM_NAMES)],
        constraints=["node.role==manager"],
        endpoint_spec=docker.types.EndpointSpec(mode="dnsrr"),
        labels={"corral.test": "1"},
        healthcheck=docker.types.Healthcheck(test=["NONE"]),
        user="root",
        restart_policy=docker.types.RestartPolicy(condition="none"),
    )
    deadline = time.monotonic() + 120
    while True:
        tasks = [t for t in manager.api.tasks(filters={"service": UPSTREAM}) if t["Status"]["State"] == "running"]
        for attachment in tasks[0].get("NetworksAttachments", []) if tasks else []:
            if attachment["Network"]["Spec"]["Name"] == EGRESS_NETWORK:
                return str(attachment["Addresses"][0]).split("/")[0], ca_path
        assert time.monotonic() < deadline, "the fake upstream did not start on the swarm"
        time.sleep(0.5)


@pytest.fixture(scope="session")
def swarm(tmp_path_factory: pytest.TempPathFactory, desktop_image: str, egress_image: str) -> Iterator[Swarm]:
    """``desktop_image`` and ``egress_image``: built on the host (unless CORRAL_SKIP_BUILD=1), then pushed."""
    env = _swarm_env()
    keep = os.environ.get("CORRAL_SWARM_KEEP") == "1"
    directory = Path(env["CORRAL_SWARM_DIR"])
    if not (keep and (directory / "1" / "docker.sock").exists()):
        _run(env, "down", timeout=600)
        _run(env, "up", "--images", timeout=900)
    manager = docker.DockerClient(base_url=f"unix://{directory}/1/docker.sock", timeout=120)
    try:
        manager.networks.create(EGRESS_NETWORK, driver="overlay", attachable=True, labels={"corral.role": "network"})
    except docker.errors.APIError as exc:
        assert exc.status_code == 409, exc
    registry = f"{env['CORRAL_SWARM_NET']}.1:5000"
    desktop = f"{registry}/{env['CORRAL_IMAGE'].split(':')[0]}:latest"
    address, ca_path = _start_upstream(manager, tmp_path_factory.mktemp("swarm-upstream"), desktop)
    # The gateway again, its proxies trusting the upstream's CA and its address alone.
    data = directory / "gateway" / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "upstream-ca.pem").write_bytes(ca_path.read_bytes())
    env_file = directory / "gateway" / "env"
    env_file.write_text(
        f"CORRAL_EGRESS_TRUSTED_NETWORKS={address}/32\nCORRAL_EGRESS_UPSTREAM_CA=/var/lib/corral/upstream-ca.pem\n"
    )
    _run({**env, "CORRAL_SWARM_GATEWAY_ENV": str(env_file)}, "gateway", timeout=300)
    url = f"http://127.0.0.1:{env['CORRAL_SWARM_PORT']}"
    try:
        yield Swarm(env, url, (data / "api_key").read_text().strip(), manager, address)
    finally:
        manager.close()
        if not keep:
            _run(env, "down", timeout=600)
