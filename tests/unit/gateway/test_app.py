"""``create_app``: the routers, the error table and the settings, wired; the OpenAPI description."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute

from corral.gateway import routes
from corral.gateway.app import create_app
from corral.gateway.routes import ROUTERS
from corral.gateway.routes.deps import BodyOf

from .routes.conftest import client_for, settings_for

ROOT = Path(__file__).resolve().parents[3]


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
    assert served == declared and served
    # Every router a module of corral.gateway.routes makes is one create_app includes.
    modules = [
        importlib.import_module(f"{routes.__name__}.{info.name}") for info in pkgutil.iter_modules(routes.__path__)
    ]
    made = {id(module.router) for module in modules if isinstance(getattr(module, "router", None), APIRouter)}
    assert made == {id(router) for router in ROUTERS}


_METHOD = r"(GET|POST|PUT|PATCH|DELETE|WS)"


def _shape(path: str) -> str:
    """A path with each parameter (``{id}``, ``{session_id}``, ``<n>.webp``) as ``{}``, and no trailing
    slash, query or fragment: the docs name parameters their own way."""
    path = re.split(r"[?#]", path)[0].rstrip("/")
    return "/".join("{}" if re.search(r"[{<]", part) else part for part in path.split("/"))


def _documented() -> set[tuple[str, str]]:
    """(method, shape) of every endpoint docs/*.md names in code: `GET /v1/...`, a bare `GET` before
    a `WS /v1/...` (both), and on the same line an alias `/json/list/` of the last one named (the
    part from its first segment on replaced). A path ending in `/...` stands for everything under it."""
    found: set[tuple[str, str]] = set()
    for doc in (ROOT / "docs").glob("*.md"):
        for line in doc.read_text().splitlines():
            last: tuple[list[str], str] | None = None
            pending: list[str] = []
            for span in re.findall(r"`([^`]+)`", line):
                if re.fullmatch(_METHOD, span):
                    pending.append(span)
                    continue
                named = re.match(_METHOD + r" (/\S*)", span)
                if named:
                    last = ([*pending, named.group(1)], named.group(2))
                elif span.startswith("/") and last is not None:
                    head = span.split("/")[1]
                    cut = last[1].rfind(f"/{head}")
                    last = (last[0], last[1][:cut] + span) if cut >= 0 else last
                else:
                    continue
                pending = []
                found.update((method, _shape(last[1])) for method in last[0])
    return found


def test_every_route_is_in_the_docs() -> None:
    """Every HTTP route and WebSocket the gateway serves is named in docs/*.md (a new one fails here
    until it is documented; one removed shows in the docs' diff)."""
    documented = _documented()
    under = {(method, shape.removesuffix("/...")) for method, shape in documented if shape.endswith("/...")}
    served = [
        (method, route.path)
        for router in ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute | APIWebSocketRoute)
        for method in (route.methods if isinstance(route, APIRoute) else {"WS"})
    ]
    missing = [
        f"{method} {path}"
        for method, path in served
        if (method, _shape(path)) not in documented
        and not any(m == method and f"{_shape(path)}/".startswith(f"{base}/") for m, base in under)
    ]
    assert served and missing == []
