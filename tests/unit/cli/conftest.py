"""The CLI's gateway, faked at its one seam (``common.gateway``): the SDK's client as the CLI makes it
(its URL and key from the environment), over a transport that hands each request to a test's handler."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from corral.cli import common
from corral.gateway_client import Gateway

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Callable[[Handler], list[httpx.Request]]:
    """``gateway(handler)`` routes the CLI's gateway client to ``handler``; returns the requests it saw."""
    monkeypatch.setenv("CORRAL_API_KEY", "key-1")
    monkeypatch.setenv("CORRAL_URL", "http://gateway.test")
    seen: list[httpx.Request] = []

    def install(handler: Handler) -> list[httpx.Request]:
        def record(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return handler(request)

        monkeypatch.setattr(
            common, "gateway", lambda: Gateway(common.url(), common.api_key(), transport=httpx.MockTransport(record))
        )
        return seen

    return install
