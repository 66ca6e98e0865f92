"""``create_app``: the routers, the error table and the settings, wired; the OpenAPI description."""

from __future__ import annotations

from pathlib import Path

from fastapi.routing import APIRoute, APIWebSocketRoute

from corral.gateway.app import create_app
from corral.gateway.routes import ROUTERS

from .routes.conftest import client_for, settings_for


async def test_the_openapi_description_keeps_the_bodies(tmp_path: Path) -> None:
    async with client_for(create_app(settings_for(tmp_path))) as anon:
        schema = (await anon.get("/openapi.json")).json()
    body = schema["paths"]["/v1/sessions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CreateSession"}
    assert "Viewport" in schema["components"]["schemas"]
    patch = schema["paths"]["/v1/sessions/{session_id}"]["patch"]["requestBody"]["content"]["application/json"]
    assert patch["schema"] == {"$ref": "#/components/schemas/UpdateSession"}
    link = schema["paths"]["/v1/sessions/{session_id}/links"]["post"]["requestBody"]["content"]["application/json"]
    assert link["schema"] == {"$ref": "#/components/schemas/CreateLink"}


def test_every_router_is_wired_and_nothing_else(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    app = create_app(settings)
    assert app.state.settings is settings
    served = {(path, method.upper()) for path, item in app.openapi()["paths"].items() for method in item}
    declared = {
        (route.path, method)
        for router in ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    assert served == declared and len(served) == 38  # 22, the links' POST, GET, DELETE and CDP's 13
    sockets = [route.path for router in ROUTERS for route in router.routes if isinstance(route, APIWebSocketRoute)]
    assert sockets == [
        "/v1/sessions/{session_id}/ws",
        "/v1/sessions/{session_id}/live",
        "/v1/sessions/{session_id}/cdp",
        "/v1/sessions/{session_id}/cdp/page/{target}",
        "/v1/sessions/{session_id}/cdp/t/{ticket}",
        "/v1/sessions/{session_id}/cdp/t/{ticket}/page/{target}",
    ]
