from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from corral.gateway.app import create_app
from corral.gateway.server import PER_REQUEST_LOGGERS, RedactTokens, _quiet_per_request_loggers, build_app, running
from corral.gateway.sessions import SessionManager

from ..mcp.handshake import INITIALIZE, MCP_HEADERS
from .routes.conftest import KEY, LoopbackRuntime, closed_port, settings_for


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("127.0.0.1:5", "/v1/sessions/s/ws?token=SECRET"), "/v1/sessions/s/ws?token=[redacted]"),
        (("127.0.0.1:5", "/v1/sessions/s/ws?a=1&token=SECRET&b=2"), "/v1/sessions/s/ws?a=1&token=[redacted]&b=2"),
        (("127.0.0.1:5", "/v1/health"), "/v1/health"),
        (("127.0.0.1:5", "/v1/sessions/s/cdp/t/PAYLOAD.SECRET"), "/v1/sessions/s/cdp/t/[redacted]"),
        (("127.0.0.1:5", "/v1/sessions/s/cdp/t/PAYLOAD.SECRET/json/version"), "/cdp/t/[redacted]/json/version"),
        # Other spellings of the name the server reads as ``token`` (or a key's name).
        (("127.0.0.1:5", "/v1/sessions/s/ws?%74oken=SECRET"), "/v1/sessions/s/ws?%74oken=[redacted]"),
        (("127.0.0.1:5", "/v1/sessions/s/ws?to%6Ben=SECRET&b=2"), "?to%6Ben=[redacted]&b=2"),
        (("127.0.0.1:5", "/v1/sessions/s/ws?TOKEN=SECRET"), "?TOKEN=[redacted]"),
        (("127.0.0.1:5", "/v1/sessions/s/ws?%2574oken=SECRET"), "?%2574oken=[redacted]"),
        (("127.0.0.1:5", "/v1/sessions/s/ws?a=1;api%5Fkey=SECRET"), "?a=1;api%5Fkey=[redacted]"),
        (("127.0.0.1:5", "/v1/sessions/s/ws?tok+en=1&token+=SECRET"), "?tok+en=1&token+=[redacted]"),
        # A ticket's path as the server routes it (segments percent-encoded, even its slashes).
        (("127.0.0.1:5", "/v1/sessions/s/cdp/%74/PAYLOAD.SECRET/json"), "/v1/sessions/s/cdp/t/[redacted]/json"),
        (("127.0.0.1:5", "/v1/sessions/s/%63dp%2Ft%2FPAYLOAD.SECRET"), "/v1/sessions/s/cdp/t/[redacted]"),
    ],
)
def test_tokens_never_reach_the_log(args: tuple[str, str], expected: str) -> None:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]', args, None)
    assert RedactTokens().filter(record) is True
    message = record.getMessage()
    assert "SECRET" not in message
    assert expected in message


def test_a_held_open_mcp_stream_delays_the_stop_only_by_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn waits for open connections before the lifespan's shutdown: an MCP client's event
    stream is cut after ``shutdown_grace_s`` and the sessions are stopped all the same."""
    stopped = threading.Event()
    real_stop = SessionManager.stop

    async def stop(self: SessionManager) -> None:
        await real_stop(self)
        stopped.set()

    monkeypatch.setattr(SessionManager, "stop", stop)
    settings = settings_for(tmp_path, port=closed_port(), shutdown_grace_s=1)
    app = build_app(settings, runtime=LoopbackRuntime())
    streaming, ended = threading.Event(), threading.Event()

    def hold_a_stream(mcp: str, headers: dict[str, str]) -> None:
        with httpx.Client(timeout=None) as http, http.stream("GET", mcp, headers=headers) as stream:
            assert stream.status_code == 200
            streaming.set()
            with contextlib.suppress(httpx.HTTPError):
                for _ in stream.iter_raw():
                    pass
        ended.set()

    began = 0.0
    with running(settings, app=app) as url:
        headers = {"authorization": f"Bearer {KEY}", "mcp-protocol-version": "2025-11-25"}
        opened = httpx.post(f"{url}/mcp", json=INITIALIZE, headers={**headers, **MCP_HEADERS})
        headers["mcp-session-id"] = opened.headers["mcp-session-id"]
        reader = threading.Thread(target=hold_a_stream, args=(f"{url}/mcp", {**headers, "accept": "text/event-stream"}))
        reader.start()
        assert streaming.wait(10)
        began = time.monotonic()
    assert time.monotonic() - began < 5  # without the bound: until the client lets go (never, here)
    assert stopped.is_set()
    assert ended.wait(5)
    reader.join(5)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_cdp_tickets_path_never_reaches_uvicorns_log(tmp_path: Path) -> None:
    """uvicorn logs each WebSocket upgrade with its path; a ticket in the path is a credential."""
    settings = settings_for(tmp_path, port=closed_port())
    app = create_app(settings, runtime=LoopbackRuntime())
    ticket = "c2VzXzEKMTgwMDAwMDAwMAow.SECRETMAC0123456789abcdef"
    lines = Lines()
    with running(settings, app=app) as url:
        uvicorn_error = logging.getLogger("uvicorn.error")
        level = uvicorn_error.level
        uvicorn_error.setLevel(logging.INFO)  # as `corral gateway` serves; the test server logs warnings only
        uvicorn_error.addHandler(lines)
        try:
            ws_url = url.replace("http://", "ws://") + f"/v1/sessions/s1/cdp/t/{ticket}/page/T1?token=ALSOSECRET"
            with connect(ws_url) as ws, contextlib.suppress(ConnectionClosed):
                ws.recv(timeout=5)  # refused: no such ticket's session
            # The name percent-encoded (the server reads it as token all the same), the ticket's segment too.
            for path in ("/v1/sessions/s1/ws?%74oken=ENCODEDSECRET", f"/v1/sessions/s1/cdp/%74/{ticket}/page/T1"):
                with connect(url.replace("http://", "ws://") + path) as ws, contextlib.suppress(ConnectionClosed):
                    ws.recv(timeout=5)
        finally:
            uvicorn_error.removeHandler(lines)
            uvicorn_error.setLevel(level)
    upgrades = [line for line in lines.lines if "WebSocket" in line]
    assert upgrades, lines.lines
    assert len(upgrades) == 3, upgrades
    assert not [line for line in lines.lines if "SECRETMAC" in line or "ALSOSECRET" in line or "ENCODEDSECRET" in line]
    assert "/v1/sessions/s1/cdp/t/[redacted]/page/T1?token=[redacted]" in upgrades[0]


def test_calls_to_a_controller_log_no_line_each_but_warnings_still_show(caplog: pytest.LogCaptureFixture) -> None:
    _quiet_per_request_loggers()
    with caplog.at_level(logging.NOTSET):
        for name in PER_REQUEST_LOGGERS:
            logging.getLogger(name).info("HTTP Request: GET http://sandbox.invalid/v1/files")
            logging.getLogger(name).warning("the controller's connection was reset")
    assert [record.levelno for record in caplog.records] == [logging.WARNING] * len(PER_REQUEST_LOGGERS)
