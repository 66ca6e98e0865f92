from __future__ import annotations

import logging

import pytest

from corral.gateway.server import RedactTokens


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
