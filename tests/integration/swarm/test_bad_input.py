"""The swarm driver's bad input on a real swarm, each a clear error with its cause and nothing left
behind: a manager that cannot be reached, an engine that is no manager, an image no node has, a
session network that cannot be made."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from corral.errors import SandboxError
from corral.runtime import SandboxSpec, SwarmOptions, open_runtime
from corral.runtime.swarm import SwarmRuntime

from .conftest import Swarm


@pytest.fixture(scope="module")
def swarm_runtime(swarm: Swarm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SwarmRuntime]:
    options = SwarmOptions(
        gateway_container=f"{swarm.env['CORRAL_SWARM_NAME']}-gateway",
        start_timeout_s=60,
        secrets_dir=tmp_path_factory.mktemp("swarm-secrets"),
    )
    yield SwarmRuntime(client=swarm.manager, options=options)


def test_a_manager_that_cannot_be_reached_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-manager.sock")
    with pytest.raises(SandboxError, match=r"swarm driver: cannot reach the swarm manager \(DOCKER_HOST\)"):
        open_runtime("swarm")


def test_an_engine_that_is_no_swarm_manager_is_refused(swarm: Swarm) -> None:
    """A worker's engine answers, but cannot place services."""
    worker = docker.DockerClient(base_url=f"unix://{swarm.env['CORRAL_SWARM_DIR']}/2/docker.sock", timeout=30)
    with pytest.raises(SandboxError, match="no swarm manager"):
        SwarmRuntime(client=worker)


def test_an_image_no_node_has_fails_the_start_with_swarms_reason_and_leaves_nothing(
    swarm: Swarm, swarm_runtime: SwarmRuntime
) -> None:
    registry = f"{swarm.env['CORRAL_SWARM_NET']}.1:5000"
    spec = SandboxSpec(
        image=f"{registry}/corral-desktop:no-such-tag", name="corral-sandbox-missing", network="corral-sandboxes"
    )
    with pytest.raises(
        SandboxError,
        match=r"sandbox corral-sandbox-missing did not start: rejected: .*(No such image|not found|manifest unknown)",
    ):
        swarm_runtime.start_sandbox(spec)
    assert swarm.manager.services.list(filters={"name": "corral-sandbox-missing"}) == []
    assert [s.name for s in swarm.manager.secrets.list() if s.name.startswith("corral-sandbox-missing")] == []


def test_a_session_network_from_a_full_pool_is_refused_and_none_is_made(
    swarm: Swarm, swarm_runtime: SwarmRuntime
) -> None:
    """The pool is the egress overlay's own subnet: every /28 of it overlaps a network there is."""
    egress = swarm.manager.networks.get("corral-egress").attrs["IPAM"]["Config"][0]["Subnet"]
    with pytest.raises(SandboxError, match=r"no free /28 left in the session network pool .*CORRAL_SESSION_SUBNETS"):
        swarm_runtime.create_session_network("ses_badpool", {"corral.test": "1"}, egress)
    assert swarm.manager.networks.list(filters={"label": "corral.session=ses_badpool"}) == []
