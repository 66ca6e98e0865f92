"""The controller's link to Chromium: what DevTools names is followed only on its own address."""

from __future__ import annotations

import pytest

from corral.sandbox.browser import pinned_endpoint


@pytest.mark.parametrize(
    "named",
    [
        "ws://127.0.0.1:8765/v1/ws",  # the controller's own port
        "ws://corral-proxy:8081/",  # the proxy's control port
        "ws://127.0.0.1:9222/v1/ws",
        "wss://127.0.0.1:9222/devtools/browser/abc",
        "ws://localhost:9222/devtools/browser/abc",
        "ws://127.0.0.1:9222/devtools/browser/abc?x=1",
        "ws://u:p@127.0.0.1:9222/devtools/browser/abc",
        "ws://127.0.0.1:9222/devtools/browser/../../v1",
        None,
        42,
    ],
)
def test_a_browser_endpoint_off_the_devtools_address_is_refused(named: object) -> None:
    assert pinned_endpoint("http://127.0.0.1:9222", named) is None


def test_chromiums_own_endpoint_is_kept() -> None:
    named = "ws://127.0.0.1:9222/devtools/browser/0f4c3a9e-2b1d-4c55-9a7e-6f0e1d2c3b4a"
    assert pinned_endpoint("http://127.0.0.1:9222", named) == named
