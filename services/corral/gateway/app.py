"""The gateway's HTTP and WebSocket API (default http://127.0.0.1:8700): ``create_app`` wires the
routers (corral.gateway.routes), the error table and the state they are given; it decides nothing.
``/mcp`` is mounted on it by the server's assembly (corral.gateway.server.build_app), above both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from corral.gateway import auth, keyids
from corral.gateway.metrics import Metrics
from corral.gateway.routes import ROUTERS, errors
from corral.gateway.routes.deps import body_model
from corral.gateway.routes.live import AuthSlots
from corral.gateway.sessions import SessionManager
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.gateway.tickets import TicketSigner
from corral.runtime import SandboxRuntime, open_runtime


def default_runtime(settings: GatewaySettings) -> SandboxRuntime:
    """The runtime a gateway uses when it is given none: the driver ``CORRAL_RUNTIME`` names."""
    return open_runtime(settings.runtime, proxy_uid=settings.egress_uid)


def create_app(settings: GatewaySettings | None = None, runtime: SandboxRuntime | None = None) -> FastAPI:
    settings = settings or GatewaySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        state.keys = auth.KeyRing.for_gateway(settings)
        # Before any record is read: those an older gateway wrote name their key by its old id.
        await asyncio.to_thread(keyids.adopt, settings.data_dir, state.keys.renamed)
        state.metrics = Metrics()
        sandboxes = runtime if runtime is not None else await asyncio.to_thread(default_runtime, settings)
        store = SessionStore(settings.data_dir)
        state.manager = SessionManager(settings, sandboxes, store, on_claim=state.metrics.claimed)
        state.http = httpx.AsyncClient(timeout=httpx.Timeout(660.0, connect=10.0))
        await state.manager.start()
        try:
            yield
        finally:
            await state.manager.stop()
            await state.http.aclose()

    app = FastAPI(title="Corral gateway", version="1", lifespan=lifespan)
    app.state.settings = settings
    app.state.cdp_tickets = TicketSigner(settings.data_dir)  # its key is made on first use
    app.state.live_auth_slots = AuthSlots()
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    _document_bodies(app)
    return app


def _document_bodies(app: FastAPI) -> None:
    """The OpenAPI description of the bodies routes read themselves (after auth, capped): each
    route's model is found on its :class:`~corral.gateway.routes.deps.BodyOf` dependency."""
    bodies = {
        route.unique_id: model
        for router in ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute) and (model := body_model(route.dependant)) is not None
    }

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for path_item in schema.get("paths", {}).values():
            for operation in path_item.values():
                model = bodies.get(operation.get("operationId", ""))
                if model is None:
                    continue
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(model_schema.pop("$defs", {}))
                components[model.__name__] = model_schema
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
                }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["create_app"]
