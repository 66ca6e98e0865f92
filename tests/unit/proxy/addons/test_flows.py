"""How the addons read a flow (corral.proxy.addons.flows): the URL by its vetted name."""

from __future__ import annotations

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy import http
from mitmproxy.test import tflow, tutils

from corral.proxy.addons.flows import header_pairs, peer, url_of


@pytest.mark.parametrize(
    ("scheme", "port", "host", "url"),
    [
        (b"https", 443, "a.test", "https://a.test/p?q=1"),
        (b"http", 8080, "a.test", "http://a.test:8080/p?q=1"),
        (b"https", 443, "2001:db8::1", "https://[2001:db8::1]/p?q=1"),
    ],
)
def test_the_url_names_the_vetted_host_not_the_pinned_address(scheme: bytes, port: int, host: str, url: str) -> None:
    request = tutils.treq(scheme=scheme, host="203.0.113.9", port=port, path=b"/p?q=1")
    assert url_of(request, host) == url


def test_headers_are_pairs_and_a_connection_without_peer_has_none() -> None:
    assert header_pairs(http.Headers(((b"a", b"1"), (b"a", b"2")))) == [("a", "1"), ("a", "2")]
    flow = tflow.tflow()
    assert peer(flow.client_conn) == str(flow.client_conn.peername[0])
    flow.server_conn.peername = None
    assert peer(flow.server_conn) is None
