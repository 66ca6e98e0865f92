"""The gateway's HTTP and WebSocket API (default http://127.0.0.1:8700): ``create_app`` wires the
routers (corral.gateway.routes), the error table and the state they are given; it decides nothing.
``/mcp`` is mounted on it by the server's assembly (corral.gateway.server.build_app), above both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from corral.contracts.control import GatewayEvent
from corral.gateway import auth, keyids
from corral.gateway.egress import EgressManager
from corral.gateway.limits import HostFacts, resolve
from corral.gateway.links import LinkBook
from corral.gateway.metrics import Metrics
from corral.gateway.previews.book import PreviewBook
from corral.gateway.previews.listener import PreviewListener
from corral.gateway.profiles import ProfileStore, derive_key
from corral.gateway.recording import RecordingLimits, RecordingManager
from corral.gateway.replays import ReplayUploads
from corral.gateway.routes import ROUTERS, errors
from corral.gateway.routes.deps import body_model
from corral.gateway.routes.live import AuthSlots
from corral.gateway.sessions import SessionManager, SessionParts
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.brokering import SecretBroker
from corral.gateway.sessions.browserprofiles import BrowserProfiles
from corral.gateway.sessions.claims import ClaimParts, Claims, OnClaim
from corral.gateway.sessions.controllers import Controllers
from corral.gateway.sessions.egressport import EgressPort, NullEgress
from corral.gateway.sessions.endings import Endings
from corral.gateway.sessions.envs import SessionEnvs
from corral.gateway.sessions.lifetime import Lifetimes
from corral.gateway.sessions.liveness import Liveness
from corral.gateway.sessions.pausedbrowser import PausedBrowser
from corral.gateway.sessions.pausing import PauseParts, Pauses
from corral.gateway.sessions.pool import WarmPool
from corral.gateway.sessions.reaper import Archives, EgressWatch, Reaper, Round
from corral.gateway.sessions.recovery import Recovery
from corral.gateway.sessions.savedstate import BrowserState, SavedState
from corral.gateway.sessions.sessionrecordings import SessionRecordings
from corral.gateway.sessions.starts import PairStarts, SandboxStarts, Specs, Starts
from corral.gateway.sessions.templatepools import TemplatePools
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.gateway.templates.builder import TemplateBuilder
from corral.gateway.templates.catalog import TemplateCatalog
from corral.gateway.templates.resolver import TemplateResolver
from corral.gateway.tickets import TicketSigner
from corral.gateway.vitals import ControllerWatch
from corral.gateway.volumes import VolumeLimits, Volumes
from corral.runtime import SandboxRuntime, SwarmOptions, open_runtime


def default_runtime(settings: GatewaySettings) -> SandboxRuntime:
    """The runtime a gateway uses when it is given none: the driver ``CORRAL_RUNTIME`` names."""
    return open_runtime(
        settings.runtime,
        proxy_uid=settings.egress_uid,
        swarm=swarm_options(settings),
        # Each sandbox's controller secret written here for its start: none read back by an exec.
        handover_dir=settings.data_dir / "handover",
    )


def swarm_options(settings: GatewaySettings) -> SwarmOptions:
    """The swarm driver's options from ``CORRAL_SWARM_*`` (its controllers' secrets kept in the data dir)."""
    return SwarmOptions(
        gateway_container=settings.swarm_gateway_container,
        constraints=tuple(c.strip() for c in settings.swarm_constraints.split(",") if c.strip()),
        start_timeout_s=settings.swarm_start_timeout_s,
        secrets_dir=settings.data_dir / "swarm-secrets",
        guard_image=settings.image,
        encrypted_overlays=settings.swarm_encrypted_overlays,
    )


def create_app(
    settings: GatewaySettings | None = None, runtime: SandboxRuntime | None = None, previews: bool = False
) -> FastAPI:
    """The API's app; ``previews``: its lifespan also runs the preview listener on
    ``CORRAL_PREVIEW_PORT`` (the served gateway's: corral.gateway.server; a test's app binds no port)."""
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
        state.manager = build_sessions(settings, sandboxes, store, on_claim=state.metrics.claimed)
        state.templates = TemplateBuilder(
            sandboxes,
            TemplateCatalog(settings.data_dir),
            settings.image,
            settings.network,
            settings.template_context_max_mb << 20,
        )
        state.http = httpx.AsyncClient(timeout=httpx.Timeout(660.0, connect=10.0))
        await state.manager.start()
        listener = PreviewListener(settings, lambda: state.manager) if previews and settings.preview_port else None
        state.preview_listener = listener
        try:
            if listener is not None:
                await listener.start()
            yield
        finally:
            if listener is not None:
                await listener.stop()
            for build in list(state.template_builds):  # its thread ends the build; its answer has no reader
                build.cancel()
            await asyncio.gather(*state.template_builds, return_exceptions=True)
            await state.manager.stop()
            await state.http.aclose()

    app = FastAPI(title="Corral gateway", version="1", lifespan=lifespan)
    app.state.settings = settings
    app.state.cdp_tickets = TicketSigner(settings.data_dir)  # its key is made on first use
    app.state.live_auth_slots = AuthSlots()
    app.state.template_builds = set()  # the builds' tasks (POST /v1/templates), kept
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    _document_bodies(app)
    return app


def build_sessions(
    settings: GatewaySettings,
    runtime: SandboxRuntime,
    store: SessionStore,
    on_claim: OnClaim = lambda source, seconds: None,
    host: HostFacts | None = None,
    controller_transport: httpx.AsyncBaseTransport | None = None,
    egress: EgressManager | None = None,
    browser_state: BrowserState | None = None,
) -> SessionManager:
    """The session side, wired: the one place that asks whether egress control is on. ``egress``,
    ``controller_transport`` and ``browser_state`` are a test's (None: the real egress manager when
    ``CORRAL_EGRESS``, the network, and a paused browser's state through the browser-profiles seam)."""
    if egress is None and settings.egress:
        egress = EgressManager(settings, runtime)
    limits = resolve(settings, host or HostFacts.detect())
    specs = Specs(settings, limits)
    port: EgressPort = egress if egress is not None else NullEgress()
    pair_starts = PairStarts(settings, runtime, specs, egress, settings.ground_pool_size) if egress else None
    starts: Starts = pair_starts or SandboxStarts(settings, runtime, specs)
    book, controllers = SessionBook(store), Controllers(controller_transport)
    recordings = SessionRecordings(_recording_manager(settings), port, controllers)
    replays = ReplayUploads(settings.data_dir / "replay-responses", settings.replay_upload_max_mb << 20)
    volumes = Volumes(settings.data_dir / "volumes", runtime, VolumeLimits.from_settings(settings))
    profiles = BrowserProfiles(_profile_store(settings), runtime, port)
    endings = Endings(book, runtime, port, recordings, volumes=volumes, profiles=profiles)
    broker = SecretBroker(book, port, controllers, settings.egress_mode)
    pool = WarmPool(settings.pool_size, settings.egress_mode, starts, port, controllers)
    liveness = Liveness(book, runtime, endings, controllers, _vitals(settings), settings.controller_dead_after_s)
    archives = Archives(settings, book, starts, port, recordings, replays)
    reaper = Reaper(runtime, specs, book, pool, starts, liveness, endings, archives)
    if egress is not None:
        watch = EgressWatch(book, port, endings, reaper, settings.reap_interval_s)
        reaper.add_rounds(
            Round("egress watchdog", watch.watch), Round("placeholder watchdog", broker.check_placeholders)
        )
    envs = SessionEnvs(book, controllers)
    reaper.add_rounds(Round("env watchdog", envs.check))
    resolver = TemplateResolver(runtime, TemplateCatalog(settings.data_dir), settings.image)

    def template_pool(image_of: Callable[[], str], size: int) -> WarmPool:
        return WarmPool(size, settings.egress_mode, starts, port, controllers, image_of)

    templates = TemplatePools(resolver, settings.pool, template_pool)
    claim_parts = ClaimParts(
        egress=port,
        broker=broker,
        recordings=recordings,
        replays=replays,
        envs=envs,
        volumes=volumes,
        templates=templates,
        profiles=profiles,
    )
    claims = Claims(settings, book, pool, starts, claim_parts, on_claim)
    recovery = Recovery(book, runtime, specs, starts, port, recordings, volumes)
    links = LinkBook(book.links_of, book.save_links, _reporter(book, port))
    previews = PreviewBook(book.previews_of, book.save_previews, _reporter(book, port))
    grounds = pair_starts.grounds if pair_starts is not None else None
    saved = SavedState(settings.data_dir / "paused", controllers, settings.pause_archive_max_mb << 20)
    paused_browser = browser_state or PausedBrowser(profiles, saved.root, saved.max_bytes)
    endings.paused_browser_state = paused_browser.state
    pause_parts = PauseParts(
        saved=saved,
        browser=paused_browser,
        claims=claims,
        broker=broker,
        recordings=recordings,
        envs=envs,
        templates=templates,
        volumes=volumes,
    )
    pauses = Pauses(settings, book, runtime, port, specs, pause_parts)
    reaper.pauses, endings.discard_saved = pauses, pauses.discard
    reaper.pools = lambda: [pool, *templates.pools()]
    # fmt: off
    parts = SessionParts(
        runtime=runtime, network=settings.network, reap_interval_s=settings.reap_interval_s, limits=limits,
        book=book, egress=port, grounds=grounds, starts=starts, pool=pool, claims=claims, broker=broker,
        endings=endings, liveness=liveness, recovery=recovery, reaper=reaper, controllers=controllers,
        recordings=recordings, replays=replays, links=links, previews=previews,
        lifetimes=Lifetimes(book, port, settings.max_timeout_s),
        volumes=volumes,
        profiles=profiles,
        pauses=pauses,
    )
    # fmt: on
    return SessionManager(parts)


def _profile_store(settings: GatewaySettings) -> ProfileStore:
    """Saved browser profiles under the operator's key; without one, a store that says profiles are off."""
    secret = settings.profile_secret()
    key = derive_key(secret) if secret is not None else None
    return ProfileStore(settings.data_dir / "profiles", key, settings.profile_max_mb << 20)


def _vitals(settings: GatewaySettings) -> ControllerWatch:
    return ControllerWatch(
        settings.controller_max_restarts, settings.controller_restart_window_s, settings.controller_dead_after_s
    )


def _reporter(book: SessionBook, egress: EgressPort) -> Callable[[str, GatewayEvent], Awaitable[None]]:
    async def report(session_id: str, message: GatewayEvent) -> None:
        """A link's or preview's change into the session's audit chain (none on a gateway without
        egress control)."""
        session = book.get(session_id)
        if session.egress is not None:
            await egress.report(session.egress, message)

    return report


def _recording_manager(settings: GatewaySettings) -> RecordingManager | None:
    if not settings.record:
        return None
    return RecordingManager(settings.data_dir / "recordings", RecordingLimits.from_settings(settings))


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


__all__ = ["build_sessions", "create_app"]
