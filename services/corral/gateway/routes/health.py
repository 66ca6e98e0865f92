"""``/v1/health`` and ``/metrics`` (Prometheus): open to anyone who reaches the gateway's address."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from corral.gateway.routes.deps import EgressArchiveDep, ManagerDep, MetricsDep, SettingsDep

router = APIRouter(tags=["health"])


@router.get("/v1/health")
async def health(manager: ManagerDep, settings: SettingsDep, egress_manager: EgressArchiveDep) -> dict[str, Any]:
    egress = (
        {"enabled": True, "mode": settings.egress_mode, "network": settings.egress_network}
        if egress_manager is not None
        else {"enabled": False}
    )
    return {
        "ok": True,
        "sessions": manager.counts(),
        "pool_target": settings.pool_size,
        # Made ahead for cold starts with egress control: a bench waits for them before timing one.
        "grounds": {"held": manager.grounds_held(), "target": settings.ground_pool_size if egress_manager else 0},
        "host_guard": manager.host_guarded,
        "limits": manager.limits.health(),
        "egress": egress,
    }


@router.get("/metrics")
async def metrics(manager: ManagerDep, m: MetricsDep) -> Response:
    return Response(m.render(manager.counts()), media_type="text/plain; version=0.0.4")
