"""``/v1/health`` and ``/metrics``."""

from __future__ import annotations

import json
import warnings
from typing import Any

from .conftest import Client

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient


def test_health_shows_the_limits(live: tuple[TestClient, str, str]) -> None:
    client, _, _ = live
    health: dict[str, Any] = client.get("/v1/health").json()
    limits: dict[str, Any] = health["limits"]
    assert {"default_cpus", "default_memory_mb", "fits_host", "warnings"} <= limits.keys()
    assert json.dumps(limits)
    assert health["ok"] is True and health["sessions"]["ready"] == 1
    assert health["egress"] == {"enabled": False} and health["pool_target"] == 1
    assert health["grounds"] == {"held": 0, "target": 0}  # no egress control: no groundwork made ahead


async def test_metrics_count_refusals_by_code(client: Client) -> None:
    async with client() as anon:
        assert (await anon.get("/v1/sessions")).status_code == 401
        text = (await anon.get("/metrics")).text
    assert 'corral_errors_total{code="unauthorized"} 1.0' in text
    assert 'corral_sessions{state="ready"} 0.0' in text
