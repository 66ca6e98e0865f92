"""``create_app``: the routers, the error table and the settings, wired; the OpenAPI description."""

from __future__ import annotations

from pathlib import Path

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute

from corral.gateway.app import create_app
from corral.gateway.routes import ROUTERS
from corral.gateway.routes.deps import BodyOf

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


def _bodies_read(dependant: Dependant) -> list[str]:
    """The names of the models a route's dependencies read as its JSON body (:class:`BodyOf`)."""
    own = [dependant.call.model.__name__] if isinstance(dependant.call, BodyOf) else []
    return own + [name for sub in dependant.dependencies for name in _bodies_read(sub)]


def test_every_route_that_reads_a_json_body_documents_it(tmp_path: Path) -> None:
    """Found from the routes themselves: a new route that reads a body (BodyOf, the one way to) and
    whose schema is not in the OpenAPI description fails here."""
    schema = create_app(settings_for(tmp_path)).openapi()
    reading = [
        (route.path, method.lower(), body)
        for router in ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute)
        for body in _bodies_read(route.dependant)
        for method in route.methods
    ]
    assert {(path, method) for path, method, _ in reading} >= {
        ("/v1/sessions", "post"),
        ("/v1/sessions/{session_id}/cdp/connect", "post"),
    }
    for path, method, body in reading:
        request_body = schema["paths"][path][method].get("requestBody")
        assert request_body is not None, f"{method.upper()} {path} reads a {body} but documents no body"
        assert request_body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{body}"}
        assert body in schema["components"]["schemas"]


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
