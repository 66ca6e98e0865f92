"""``python -m corral.gateway.server``: serve the gateway with uvicorn (or in a thread, for tests and bench).

:func:`build_app` assembles what is served: the gateway's app (corral.gateway.app) and, when the
``mcp`` package is installed, ``/mcp`` (corral.mcp.transports) on it. It sits above both, since the
MCP transport builds on the gateway's auth: the app itself knows nothing of MCP.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from corral.contracts.limits import CDP_MAX_FRAME_BYTES
from corral.errors import WeakApiKey
from corral.gateway.app import create_app
from corral.gateway.settings import GatewaySettings
from corral.runtime import SandboxRuntime

# The MCP SDK is an optional dependency (docs/mcp.md): without it the gateway serves all but /mcp.
MCP_INSTALLED = importlib.util.find_spec("mcp") is not None
if MCP_INSTALLED:
    from corral.mcp.transports import mount as mount_mcp

# A query parameter whose name says it holds a credential (token, key, ...), read as the server reads
# it: percent-decoded (and '+' as a space), in any case, also when encoded twice over.
_SENSITIVE_NAME = re.compile(r"token|key|secret|ticket|credential|password", re.IGNORECASE)
_PARAM = re.compile(r"(?P<name>[^\s=&;?\"']+)=(?P<value>[^\s&;\"']*)")
# A CDP connect ticket in a path (/v1/sessions/<id>/cdp/t/<ticket>/...), on the path as routed (decoded).
_CDP_TICKET = re.compile(r"(/cdp/t/)[^/?\s\"']+", re.IGNORECASE)
_DECODINGS = 3  # a name encoded more often than this is no name the server reads
REDACTED = "[redacted]"


def _decoded(text: str) -> str:
    for _ in range(_DECODINGS):
        plain = urllib.parse.unquote_plus(text)
        if plain == text:
            break
        text = plain
    return text


def _redact_param(match: re.Match[str]) -> str:
    name = match.group("name")
    if _SENSITIVE_NAME.search(_decoded(name)) is None:
        return match.group()
    return f"{name}={REDACTED}"


def _redact_path(match: re.Match[str]) -> str:
    """A URL-like word with a CDP ticket in its path, however its segments are encoded: the path as
    the server routes it (decoded), the ticket redacted."""
    word = match.group()
    path, mark, query = word.partition("?")
    routed = _decoded(path)
    if _CDP_TICKET.search(routed) is None:
        return word
    return _CDP_TICKET.sub(r"\1" + REDACTED, routed) + mark + query


def redact(text: str) -> str:
    """``text`` with every credential a URL in it may carry replaced by ``[redacted]``."""
    if "=" in text:
        text = _PARAM.sub(_redact_param, text)
    if "/" in text:
        text = re.sub(r"[^\s\"']*/[^\s\"']*", _redact_path, text)
    return text


class RedactTokens(logging.Filter):
    """Keeps tokens out of uvicorn's lines (a WebSocket's ``?token=`` and a CDP ticket's path would
    otherwise be logged with each upgrade)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def _install_redaction() -> None:
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in logger.filters):
            logger.addFilter(RedactTokens())


# Loggers that write a line per request the gateway makes (httpx's "HTTP Request: ..." for every call to a
# controller: each file transfer, HTTP action and health poll): kept to warnings, as the relay logs no frame.
PER_REQUEST_LOGGERS = ("httpx", "httpcore")


def _quiet_per_request_loggers() -> None:
    for name in PER_REQUEST_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def build_app(settings: GatewaySettings | None = None, runtime: SandboxRuntime | None = None) -> FastAPI:
    """The gateway as served: :func:`~corral.gateway.app.create_app`, with ``/mcp`` where the SDK is."""
    settings = settings or GatewaySettings()
    app = create_app(settings, runtime, previews=True)
    add_mcp(app, settings)
    return app


def add_mcp(app: FastAPI, settings: GatewaySettings) -> None:
    """``/mcp`` (corral.mcp, docs/mcp.md) on ``app`` when the ``mcp`` package is installed."""
    if MCP_INSTALLED:
        mount_mcp(app, settings)


def _config(settings: GatewaySettings, log_level: str = "info", app: ASGIApp | None = None) -> uvicorn.Config:
    return uvicorn.Config(
        app if app is not None else build_app(settings),
        host=settings.host,
        port=settings.port,
        ws="websockets-sansio",
        # Screenshots barely compress and deflate costs ~17 ms a frame.
        ws_per_message_deflate=False,
        # CDP's frames are larger (corral.contracts.cdprules); the agent's relay keeps MAX_FRAME_BYTES.
        ws_max_size=CDP_MAX_FRAME_BYTES,
        access_log=False,
        log_level=log_level,
        # uvicorn waits for open connections before the lifespan's shutdown: bounded, or a client holding
        # a stream open (an MCP GET) would keep the sessions (and their sandboxes) from being stopped.
        timeout_graceful_shutdown=settings.shutdown_grace_s,
    )


def serve(settings: GatewaySettings | None = None) -> None:
    settings = settings or GatewaySettings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings.api_keys()  # a weak key refused now, in one line, not in the lifespan's traceback
    except WeakApiKey as exc:
        raise SystemExit(str(exc)) from None
    config = _config(settings)
    config.load()  # uvicorn configures its loggers here; the filter goes on after
    _install_redaction()
    _quiet_per_request_loggers()
    uvicorn.Server(config).run()


@contextmanager
def running(settings: GatewaySettings, start_timeout_s: float = 60.0, app: ASGIApp | None = None) -> Iterator[str]:
    """Serve ``app`` (default: the gateway for ``settings``) in a background thread until the block ends;
    yields the base URL.

    Stopping leaves the gateway's sandboxes running, exactly as a restart of the process would.
    """
    config = _config(settings, log_level="warning", app=app)
    config.load()
    _install_redaction()
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="corral-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.05)
    try:
        yield f"http://{settings.host}:{settings.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


if __name__ == "__main__":
    serve()
