"""The controller's HTTP and WebSocket surface: ``GET /healthz``, ``POST /v1/actions``, ``WS /v1/ws``,
``WS /v1/live`` (corral.sandbox.control.viewers), ``PUT``/``GET /v1/files``, the gateway's ``PUT``/``GET /v1/secrets``,
CDP (``GET /v1/cdp/json/version``, ``/v1/cdp/json/list``, ``WS /v1/cdp``: corral.sandbox.web.cdp), and port
previews' ``WS /v1/tunnel/{port}`` (corral.sandbox.tunnel)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import pwd
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.bodies import ClosingStream, read_capped
from corral.contracts.auth import RequestVerifier, read_secret
from corral.contracts.limits import MAX_FRAME_BYTES
from corral.errors import ActionError, ErrorCode, error_body
from corral.frames import next_frame, over_limit
from corral.protocol import reply
from corral.protocol import results as r
from corral.protocol.actions import native_action
from corral.protocol.envelope import Limits, decode
from corral.sandbox import downloads, tunnel
from corral.sandbox.agent.agentenv import AGENT_USER
from corral.sandbox.agent.freezer import AgentFreezer
from corral.sandbox.control.lease import ControlLease
from corral.sandbox.control.live import LiveView, ThreadEncoder
from corral.sandbox.control.takeover import LeaseLog
from corral.sandbox.control.viewers import HumanInput, Viewers, admitted
from corral.sandbox.desktop import Desktop
from corral.sandbox.dispatch import Dispatcher, Incoming, fitted
from corral.sandbox.display import clipboard
from corral.sandbox.guard import ControllerGuard
from corral.sandbox.placeholders import placeholders_of
from corral.sandbox.previewdoor import open_door
from corral.sandbox.recorder import Recorder
from corral.sandbox.sessionenv import env_of
from corral.sandbox.settings import ControllerSettings
from corral.sandbox.tools import transfer
from corral.sandbox.tools.files import AgentFiles
from corral.sandbox.tools.transfer_record import Sent, Tallied, Transfer
from corral.sandbox.web import cdp
from corral.sandbox.web.downloadwatch import DownloadWatch
from corral.sandbox.web.pagekeeper import PageKeeper
from corral.sandbox.web.tabs import open_blank

log = logging.getLogger(__name__)

_STATUS: dict[str, int] = {
    ErrorCode.MESSAGE_TOO_LARGE: 413,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.BROWSER_UNAVAILABLE: 503,
    ErrorCode.NAVIGATION_FAILED: 502,
    ErrorCode.CLIPBOARD_FAILED: 502,
    ErrorCode.NO_SUCH_TAB: 404,
    ErrorCode.NO_SUCH_FILE: 404,
    ErrorCode.NO_SUCH_DOWNLOAD: 404,
    ErrorCode.DOWNLOAD_UNAVAILABLE: 409,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.FILE_EXISTS: 409,
    ErrorCode.CONTROL_TAKEN: 409,
    ErrorCode.DIRECTORY_NOT_EMPTY: 409,
    ErrorCode.CODE_CONTEXT_LIMIT: 409,
    ErrorCode.KERNEL_FAILED: 500,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.NO_SPACE: 507,
    ErrorCode.FILE_FAILED: 500,
    ErrorCode.INTERNAL: 500,
}


def _dispatcher(conn: HTTPConnection) -> Dispatcher:
    dispatcher: Dispatcher = conn.app.state.dispatcher
    return dispatcher


def _desktop(conn: HTTPConnection) -> Desktop:
    desktop: Desktop = conn.app.state.desktop
    return desktop


def _files(conn: HTTPConnection) -> AgentFiles:
    files: AgentFiles | None = conn.app.state.files
    if files is None:
        raise ActionError(ErrorCode.UNSUPPORTED, "file transfers need the sandbox's launcher, which is not running")
    return files


def _error(exc: ActionError) -> JSONResponse:
    # The whole error: a refusal by the lease names its holder and since when.
    return JSONResponse({"ok": False, "error": exc.to_dict()}, status_code=_STATUS.get(exc.code, 400))


async def _agent_may_transfer(conn: HTTPConnection, query: transfer.FileQuery) -> None:
    """A file transfer is the agent's act, as a command is: while a human (or an exclusive CDP client)
    holds the lease it waits up to ``?wait_for_control_ms=`` for it to come back, else
    :class:`~corral.errors.ControlTaken` (409, with the holder and since when)."""
    lease: ControlLease | None = conn.app.state.lease
    if lease is not None:
        await lease.agent_may_act(query.wait_for_control_ms)


def _int_query(conn: HTTPConnection, name: str) -> int:
    """A whole-number query parameter (0 when absent); anything else is the caller's error, named."""
    raw = conn.query_params.get(name, "0")
    try:
        return int(raw)
    except ValueError:
        raise ActionError(ErrorCode.INVALID_FIELD, f"{name} must be a whole number, not {raw!r}", name) from None


def create_app(settings: ControllerSettings | None = None) -> Starlette:
    settings = settings or ControllerSettings()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.verifier = _verifier(settings)
        desktop = Desktop.open(settings)
        app.state.desktop = desktop
        app.state.lease = desktop.lease
        reporter = settings.action_reporter()
        app.state.reporter = reporter
        recorder = Recorder(desktop) if settings.record else None
        app.state.recorder = recorder
        # PUT/GET /v1/files: the desktop's AgentFiles, and tar run as the agent through the launcher.
        app.state.files = desktop.files
        if desktop.processes is not None:
            app.state.agent_command = transfer.LauncherCommand(desktop.processes.launcher)
        # Every change of the control lease: a recording event and an audit record.
        lease_log = LeaseLog(desktop.lease, recorder, reporter)
        # The agent's processes stopped while a human holds the lease (and continued at start: a
        # restarted controller holds no human lease, whatever an earlier one froze).
        # The selections emptied before the thaw that ends a person's turn: what they copied is not the
        # agent's to paste.
        freezer = AgentFreezer(
            desktop.lease,
            desktop.processes.launcher if desktop.processes is not None else None,
            before_thaw=functools.partial(clipboard.clear, settings.display),
        )
        freezer.start()
        app.state.dispatcher = Dispatcher(
            desktop, settings.limits(), reporter, recorder, turn_over=freezer.thawed_for_agent
        )
        relays = cdp.Relays(desktop.browser.last_page, desktop.browser.downloads.acts)
        app.state.cdp_relays = relays
        app.state.max_body = settings.max_message_bytes
        # WS /v1/live: frames grabbed and encoded only while a stream is open.
        encoder = ThreadEncoder()
        live = LiveView(desktop.screen, encoder, busy=desktop.lock.locked, action_ended=desktop.lock.ended)
        viewers = Viewers(desktop, live, HumanInput(desktop, reporter, recorder, freezer))
        app.state.viewers = viewers
        # The sandbox's own browser opens its previews here, on its own loopback (docs/previews.md).
        door = await open_door(settings.preview_door_port, AGENT_USER)
        app.state.agent_uid = _uid_of(AGENT_USER)
        # Every download of the browser, whoever started it (docs/downloads.md): watched in the background.
        app.state.browser_uid = downloads.browser_uid()
        watch = DownloadWatch(settings.cdp_url, desktop.browser.downloads, reporter, recorder)
        watch.start()
        # Chromium runs on without a window; the controller keeps a page open in it (docs/design/0384).
        keeper = PageKeeper(settings.cdp_url, functools.partial(open_blank, settings.cdp_url))
        keeper.start()
        app.state.page_keeper = keeper
        # No Playwright connection at boot: its driver (node, about 80 MiB) starts on the first browser
        # call and stops again when idle (corral.sandbox.web.browser), so an idle session holds none.
        # What the first action needs and the import left unbuilt, built while the start waits for
        # Chromium's first page rather than inside that action (docs/design/0470).
        warm = asyncio.create_task(asyncio.to_thread(_warm_up))
        try:
            yield
        finally:
            await watch.close()
            await keeper.close()
            if door is not None:
                await door.close()
            await viewers.close()  # its viewers' detaching changes the lease: recorded and audited first
            await relays.close()  # as do exclusive CDP connections' detaching
            await freezer.close()  # the sandbox's own shutdown: the agent's processes continued
            encoder.close()
            await lease_log.close()
            if reporter is not None:
                await reporter.close()
            if recorder is not None:
                await recorder.close()
            await desktop.close()
            await warm  # a thread: not cancellable, and done long before any shutdown

    # Starlette, not FastAPI: nine routes need no OpenAPI or dependency injection, and FastAPI's
    # import is about 6 MiB of every idle sandbox's memory (bench/gateway.py's idle session).
    app = Starlette(routes=ROUTES, lifespan=lifespan)
    app.state.verifier = None
    app.state.recorder = None  # the lifespan's Recorder when recording is on
    app.state.files = None  # AgentFiles (the desktop's), for PUT/GET /v1/files
    app.state.lease = None  # the desktop's ControlLease: file transfers are the agent's acts too
    app.state.agent_command = None  # transfer.AgentCommand: tar as the agent, for directories
    app.state.max_upload = settings.max_upload_bytes
    app.state.boot = secrets.token_hex(8)  # this process's: a controller the init restarted has another
    app.state.max_download = settings.max_download_bytes
    app.state.reporter = None  # the lifespan's ActionReporter when the session has egress control
    app.state.cdp_url = settings.cdp_url
    app.state.cdp_relays = cdp.Relays()  # the lifespan's, which closes them at shutdown
    app.state.max_frame = settings.ws_max_frame_bytes
    app.state.browser_uid = None  # Chromium's uid: every download's file is its own
    app.add_middleware(ControllerGuard, verifier=lambda: app.state.verifier)
    return app


def _warm_up() -> None:
    """Build the validator every request's action goes through and the result a screenshot answers.
    Only a head start: a failure is said now (its task is awaited at shutdown only), and the first
    request builds them instead."""
    try:
        native_action()
        r.Done().wire()
    except Exception:
        log.exception("the controller's warm-up failed; the first action builds what it needs")


async def recording(request: Request) -> JSONResponse:
    """Recorded events after ``after`` (long-polled up to ``wait_ms``), for the gateway's recorder."""
    recorder: Recorder | None = request.app.state.recorder
    if recorder is None:
        return JSONResponse(error_body(ErrorCode.NOT_RECORDING, "recording is off"), status_code=404)
    try:
        after, wait_ms = _int_query(request, "after"), _int_query(request, "wait_ms")
    except ActionError as exc:
        return _error(exc)
    return JSONResponse(await recorder.after(after, max(0, min(wait_ms, 30_000))))


# The longest ``GET /healthz?wait_ms=`` is held for the first page (the gateway's wait at a start).
HEALTHZ_WAIT_MAX_MS = 2000


async def healthz(request: Request) -> JSONResponse:
    desktop = _desktop(request)
    keeper = getattr(request.app.state, "page_keeper", None)
    try:
        wait_ms = min(max(_int_query(request, "wait_ms"), 0), HEALTHZ_WAIT_MAX_MS)
    except ActionError as exc:
        return _error(exc)
    if keeper is not None and wait_ms:
        # Held until the first page is open rather than answered "not yet": a start's wait learns of
        # it the moment it comes, not at its next poll (and its polls cost no screen grabs meanwhile).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_ms / 1000):
                await keeper.kept.wait()
    checks = {"screen": f"{desktop.size}"}
    try:
        async with asyncio.timeout(2):
            await desktop.screen.grab()
    except (TimeoutError, OSError) as exc:
        checks["error"] = f"screen: {exc or type(exc).__name__}"
        return JSONResponse({"ok": False, **checks}, status_code=503)
    # Ready once Chromium's DevTools answer; the Playwright link is made in the background and
    # the first browser action waits for it if it must.
    if not (desktop.browser.connected or await desktop.browser.devtools_answer()):
        return JSONResponse({"ok": False, **checks, "error": "browser: DevTools not answering"}, status_code=503)
    # And once it has a page: the controller opens the first one (Chromium starts without a window).
    if keeper is not None and not keeper.kept.is_set():
        return JSONResponse({"ok": False, **checks, "error": "browser: no page open yet"}, status_code=503)
    return JSONResponse({"ok": True, **checks, "browser": "connected" if desktop.browser.connected else "up"})


async def actions(request: Request) -> Response:
    dispatcher = _dispatcher(request)
    limit = request.app.state.max_body
    body = await read_capped(request, limit)
    if body is None:
        out = dispatcher.refuse(
            ActionError(ErrorCode.MESSAGE_TOO_LARGE, f"the message is over {limit} bytes; at most {limit}")
        )
        frame = reply.encode(out)
    else:
        incoming = dispatcher.read(body)
        waited = await _wait_for_control(request, dispatcher, incoming)
        if waited is None:  # the client went away while a human held the lease: nothing runs
            return Response(status_code=204)
        # The frame fitted is the body sent: a screenshot's reply is encoded once, not twice.
        out, frame = fitted(incoming, await dispatcher.run(waited))
    status = 200 if out["ok"] else _STATUS.get(str(out["error"]["code"]), 400)
    return Response(frame, status_code=status, media_type="application/json")


async def ws(websocket: WebSocket) -> None:
    await websocket.accept()
    await Connection(websocket, _dispatcher(websocket), websocket.app.state.max_frame).serve()


async def live(websocket: WebSocket) -> None:
    """A live stream for ``viewer`` (the gateway's word, made trusted by the guard's signature)."""
    viewer, mode = websocket.query_params.get("viewer", ""), websocket.query_params.get("mode", "view")
    if not admitted(viewer, mode):
        await websocket.close(1008, "viewer=<actor>&mode=view|control (the agent views only)")
        return
    await websocket.accept()
    await websocket.app.state.viewers.serve(websocket, viewer, mode)


async def put_file(request: Request) -> JSONResponse:
    """A raw body (application/octet-stream, streamed) put in place as the agent, all or nothing;
    recorded (path, size, sha256; never the bytes) when it ends."""
    recorded = Transfer.upload(request.app.state.recorder, request.query_params)
    try:
        query = transfer.file_query(request.query_params)
        await _agent_may_transfer(request, query)
        declared, limit = request.headers.get("content-length"), request.app.state.max_upload
        written = await transfer.receive(_files(request), query, request.stream(), declared, limit)
    except ActionError as exc:
        recorded.failed(exc)
        return _error(exc)
    recorded.done(written.result().wire())
    return JSONResponse({"ok": True, **written.result().wire()})


async def get_file(request: Request) -> Response:
    """A file's bytes, or a directory as a tar stream, read as the agent; recorded (path, and the
    size and sha256 of what was sent) when the stream ends."""
    recorded = Transfer.download(request.app.state.recorder, request.query_params)
    try:
        query = transfer.file_query(request.query_params)
        await _agent_may_transfer(request, query)
        files = _files(request)
        download = await transfer.send(files, request.app.state.agent_command, query, request.app.state.max_download)
    except ActionError as exc:
        recorded.failed(exc)
        return _error(exc)
    kind: Literal["file", "directory"] = "directory" if download.media_type == transfer.TAR_MEDIA else "file"
    path = files.resolve(query.target())

    def ended(size: int, sha256: str, why_cut: str | None) -> None:
        recorded.done(Sent.of(path, kind, size, sha256, why_cut).wire())

    headers = {} if download.length is None else {"content-length": str(download.length)}
    body = Tallied(download.body, ended)
    return ClosingStream(body, body.aclose, media_type=download.media_type, headers=headers)


async def download_list(request: Request) -> JSONResponse:
    """Every download of the browser (corral.sandbox.downloads)."""
    return await downloads.listing(request)


async def download_fetch(request: Request) -> Response:
    """One download's bytes, or its error body (corral.sandbox.downloads)."""
    try:
        return await downloads.fetch(request)
    except ActionError as exc:
        return _error(exc)


async def get_secrets(request: Request) -> JSONResponse:
    """The placeholders this controller holds, for the gateway's watchdog: a controller restarted
    inside its container holds none until the gateway puts them again. Placeholders only; no values.
    ``boot`` names this controller process: the gateway counts its restarts by it (controller_dead)."""
    placeholders = dict(_desktop(request).placeholders.by_name)
    return JSONResponse({"ok": True, "secrets": placeholders, "boot": request.app.state.boot})


async def put_secrets(request: Request) -> JSONResponse:
    """The session's secret placeholders, the whole set (``{"secrets": {"NAME": "corral_secret_..."}}``),
    from the gateway: names missing from it are gone from the next command's environment. Only the
    gateway gets here (the controller's door); a bad body changes nothing."""
    limit = request.app.state.max_body
    body = await read_capped(request, limit)
    try:
        if body is None:
            raise ActionError(ErrorCode.MESSAGE_TOO_LARGE, f"the body is over {limit} bytes; at most {limit}")
        by_name = placeholders_of(decode(body, Limits(max_message_bytes=limit)))
    except ActionError as exc:
        return _error(exc)
    _desktop(request).placeholders.replace(by_name)
    log.info("the session's secret placeholders: %s", ", ".join(sorted(by_name)) or "none")
    return JSONResponse({"ok": True, "secrets": by_name})


async def get_env(request: Request) -> JSONResponse:
    """The session env this controller holds, for the gateway's watchdog: its names and one digest of
    the set (corral.contracts.envvars.digest), never the values (a restarted controller holds none
    until the gateway puts them again)."""
    session_env = _desktop(request).session_env
    return JSONResponse({"ok": True, "names": sorted(session_env.by_name), "digest": session_env.digest()})


async def put_env(request: Request) -> JSONResponse:
    """The session's environment variables, the whole set (``{"env": {"NAME": "value"}}``), from the
    gateway: checked here again (corral.sandbox.sessionenv.env_of), a bad body changes nothing. The
    answer and the log name the variables, never their values."""
    limit = request.app.state.max_body
    body = await read_capped(request, limit)
    try:
        if body is None:
            raise ActionError(ErrorCode.MESSAGE_TOO_LARGE, f"the body is over {limit} bytes; at most {limit}")
        by_name = env_of(decode(body, Limits(max_message_bytes=limit)))
    except ActionError as exc:
        return _error(exc)
    session_env = _desktop(request).session_env
    session_env.replace(by_name)
    log.info("the session's environment variables: %s", ", ".join(sorted(by_name)) or "none")
    return JSONResponse({"ok": True, "names": sorted(by_name), "digest": session_env.digest()})


async def cdp_json(request: Request) -> Response:
    """Chromium's ``/json/version`` or ``/json/list``, unchanged."""
    which: str = request.path_params["which"]
    if which not in cdp.JSON_PATHS:
        return JSONResponse(error_body(ErrorCode.NOT_FOUND, f"no /json/{which}"), status_code=404)
    try:
        answer = await cdp.devtools_json(request.app.state.cdp_url, which)
    except ActionError as exc:
        return _error(exc)
    return Response(answer.body, status_code=answer.status, media_type="application/json")


async def cdp_close(request: Request) -> JSONResponse:
    """The session's end, from the gateway before its last read of the recording: every CDP
    connection ended (its ``disconnected`` and an exclusive one's hand-back of the lease recorded)
    and none accepted any more; answered once they ended, or after ``wait_ms``. The gateway's door
    closing a connection reaches the relay only later, after the gateway's last read had been."""
    try:
        wait_ms = _int_query(request, "wait_ms")
    except ActionError as exc:
        return _error(exc)
    await request.app.state.cdp_relays.close(max(0, min(wait_ms, 30_000)) / 1000)
    return JSONResponse({"ok": True})


async def cdp_ws(websocket: WebSocket) -> None:
    """A CDP client's connection through the gateway (corral.sandbox.web.cdp)."""
    state = websocket.app.state
    lease = _desktop(websocket).lease
    await cdp.serve(websocket, state.cdp_url, lease, state.reporter, state.recorder, state.cdp_relays)


def _uid_of(user: str) -> int:
    """``user``'s uid; -1 where there is none (a controller run outside the image): then no port is
    the agent's and every tunnel is refused, never opened with the controller's own uid unchecked."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return -1


async def tunnel_ws(websocket: WebSocket) -> None:
    """A port preview's bytes to and from ``127.0.0.1:{port}`` (corral.sandbox.tunnel), for the
    agent's servers only."""
    await tunnel.serve(websocket, websocket.path_params["port"], websocket.app.state.agent_uid)


ROUTES = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/v1/recording", recording, methods=["GET"]),
    Route("/v1/actions", actions, methods=["POST"]),
    Route("/v1/files", put_file, methods=["PUT"]),
    Route("/v1/files", get_file, methods=["GET"]),
    Route("/v1/secrets", put_secrets, methods=["PUT"]),
    Route("/v1/secrets", get_secrets, methods=["GET"]),
    Route("/v1/env", put_env, methods=["PUT"]),
    Route("/v1/env", get_env, methods=["GET"]),
    Route("/v1/cdp/json/{which}", cdp_json, methods=["GET"]),
    Route("/v1/downloads", download_list, methods=["GET"]),
    Route("/v1/downloads/{download_id}", download_fetch, methods=["GET"]),
    Route("/v1/cdp/close", cdp_close, methods=["POST"]),
    WebSocketRoute("/v1/ws", ws),
    WebSocketRoute("/v1/cdp", cdp_ws),
    WebSocketRoute("/v1/live", live),
    WebSocketRoute("/v1/tunnel/{port}", tunnel_ws),
]


class Connection:
    """One WebSocket: desktop requests run one after another in the order they came (their replies
    too); command, process and file requests run beside them as they come, so a ``process_kill`` reaches
    an ``exec`` still running on the same connection. Every frame is sent whole, replies with the
    request's id, events (an exec's output) before their request's reply."""

    def __init__(self, websocket: WebSocket, dispatcher: Dispatcher, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._websocket = websocket
        # uvicorn takes CDP's larger frames (corral.contracts.cdprules); this channel keeps its own limit.
        self._max_frame = max_frame
        self._dispatcher = dispatcher
        self._sending = asyncio.Lock()
        self._desktop: asyncio.Queue[Incoming] = asyncio.Queue()
        self._apart: set[asyncio.Task[None]] = set()
        self._current: asyncio.Task[None] | None = None
        self._open = True  # the client is still there to read a reply

    async def serve(self) -> None:
        worker = asyncio.create_task(self._desktop_requests())
        try:
            while (raw := await next_frame(self._websocket)) is not None:
                if over_limit(raw, self._max_frame):
                    await self._websocket.close(code=1009, reason=f"a frame is at most {self._max_frame} bytes")
                    return
                incoming = self._dispatcher.read(raw)
                if incoming.apart:
                    task = asyncio.create_task(self._answer(incoming))
                    self._apart.add(task)
                    task.add_done_callback(self._apart.discard)
                else:
                    self._desktop.put_nowait(incoming)
        except WebSocketDisconnect:
            return
        finally:
            # The desktop request running finishes, as it always did (its reply goes nowhere, and
            # takes no hand-back with it); queued ones, and one still waiting for the lease, never
            # run. Commands still running are cancelled: their trees are killed.
            self._open = False
            worker.cancel()
            apart = list(self._apart)
            for task in apart:
                task.cancel()
            # Awaited, not only cancelled: a command's cancel kills its tree before serve returns.
            await asyncio.gather(worker, *apart, return_exceptions=True)
            if self._current is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await self._current

    async def _desktop_requests(self) -> None:
        while True:
            incoming = await self._desktop.get()
            # Outside the shield: a client gone while a human holds the lease leaves no click behind.
            incoming = await self._dispatcher.wait_for_control(incoming)
            self._current = asyncio.create_task(self._answer(incoming))
            await asyncio.shield(self._current)

    async def _answer(self, incoming: Incoming) -> None:
        out = await self._dispatcher.run(incoming, self._event, lambda: self._open)
        _, frame = fitted(incoming, out)
        await self._send(frame)  # "ok" first: the gateway's relay reads only that

    async def _event(self, event: r.OutputEvent | r.CodeResultEvent) -> None:
        await self._send(json.dumps(event.wire(), separators=(",", ":")))

    async def _send(self, frame: str) -> None:
        async with self._sending:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await self._websocket.send_text(frame)


async def _wait_for_control(request: Request, dispatcher: Dispatcher, incoming: Incoming) -> Incoming | None:
    """The request's wait for the lease, ended when its client goes away (None then). uvicorn does
    not cancel a request whose client left: its ``http.disconnect`` is watched for here, and only
    while the request waits (the body is read by then)."""
    if not dispatcher.must_wait_for_control(incoming):
        return incoming
    waiting = asyncio.create_task(dispatcher.wait_for_control(incoming))
    gone = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait((waiting, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, gone):
            task.cancel()
        await asyncio.gather(waiting, gone, return_exceptions=True)
    if gone.done() and not gone.cancelled():
        return None
    return waiting.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _verifier(settings: ControllerSettings) -> RequestVerifier | None:
    """The secret boot wrote for this boot; without it nothing but /healthz answers (fail closed)."""
    try:
        return RequestVerifier(read_secret(settings.secret_file))
    except (OSError, ValueError) as exc:
        log.error("no controller secret (%s): every route but /healthz refuses", exc)
        return None
