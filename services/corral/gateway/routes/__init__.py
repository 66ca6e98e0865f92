"""The gateway's routes, one router per resource; :data:`ROUTERS` is what ``create_app`` includes."""

from __future__ import annotations

from fastapi import APIRouter

from corral.gateway.routes import (
    actions,
    cdp,
    downloads,
    files,
    health,
    links,
    live,
    previews,
    profiles,
    recordings,
    replays,
    sessions,
    templates,
    traffic,
    volumes,
)

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    sessions.router,
    actions.router,
    files.router,
    downloads.router,
    traffic.router,
    recordings.router,
    replays.router,
    links.router,
    previews.router,
    live.router,
    cdp.router,
    volumes.router,
    templates.router,
    profiles.router,
)

__all__ = ["ROUTERS"]
