"""A claim from the warm pool, against the real Docker engine: a pooled sandbox that died while it
waited is never handed out, and the session's egress policy is in force when the token is returned.

The reaper here looks once an hour, so the claim's own last look is the only one between a pooled
sandbox's death and its hand-out."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from corral.client import SandboxClient
from corral.runtime import SandboxInfo

from .dockerutil import DockerHarness
from .gateway_fixtures import RunningGateway, module_gateway, traffic


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness, desktop_image: str, egress_image: str
) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "claim", pool_size=1, reap_interval_s=3600) as served:
        yield served


def _pooled(gw: RunningGateway, runtime: DockerHarness) -> SandboxInfo:
    (pooled,) = runtime.list_sandboxes({"corral.gateway": gw.settings.instance, "corral.kind": "pool"})
    return pooled


def test_a_pooled_sandbox_that_died_while_waiting_is_not_handed_out(gw: RunningGateway, runtime: DockerHarness) -> None:
    gw.wait_pool(1)
    dead = _pooled(gw, runtime)
    runtime.stop(dead.id)  # for good: Docker does not start it again
    with gw.client() as c:
        created = c.post("/v1/sessions", json={})
        assert created.status_code == 201, created.text
        info = created.json()
        try:
            assert info["from_pool"] is False and info["container"] != dead.id  # a cold one instead
            # The dead one was removed before the cold start began, not left for the reaper.
            assert dead.name not in runtime.container_states({"corral.gateway": gw.settings.instance})
            with SandboxClient(f"{info['ws_url']}?token={info['token']}") as sb:
                assert sb.screenshot("jpeg")[:3] == b"\xff\xd8\xff"
        finally:
            c.delete(f"/v1/sessions/{info['id']}")


def test_the_policy_is_in_force_when_the_token_is_returned(gw: RunningGateway) -> None:
    gw.wait_pool(1)
    with gw.client() as c:
        created = c.post("/v1/sessions", json={"allow": ["example.test"], "egress_mode": "enforce"}).json()
        try:
            assert created["from_pool"] is True
            # The proxy logs a policy before it takes effect and answers after: the record is there
            # as the first request with the token can be made.
            policies = traffic(gw, created["id"], event="policy")
            assert policies and policies[-1]["allow"] == ["example.test"] and policies[-1]["mode"] == "enforce"
            assert str(policies[-1]["actor"]).startswith("api-key:")
        finally:
            c.delete(f"/v1/sessions/{created['id']}")
