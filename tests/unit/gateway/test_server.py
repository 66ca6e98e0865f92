from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest

from corral.gateway.app import create_app
from corral.gateway.server import RedactTokens, running
from corral.gateway.sessions import SessionManager

from ..mcp.handshake import INITIALIZE, MCP_HEADERS
from .routes.conftest import KEY, LoopbackRuntime, closed_port, settings_for


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("127.0.0.1:5", "/v1/sessions/s/ws?token=SECRET"), "/v1/sessions/s/ws?token=[redacted]"),
        (("127.0.0.1:5", "/v1/sessions/s/ws?a=1&token=SECRET&b=2"), "/v1/sessions/s/ws?a=1&token=[redacted]&b=2"),
        (("127.0.0.1:5", "/v1/health"), "/v1/health"),
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
    app = create_app(settings, runtime=LoopbackRuntime())
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
