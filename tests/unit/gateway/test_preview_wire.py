"""What the preview listener reads and rewrites (corral.gateway.previews.wire): the secret found
wherever it rides and removed from what the agent's server gets, the headers each way, the first
visit's cookie and redirect, the error answers."""

from __future__ import annotations

import json

from corral.gateway.previews import wire

SECRET = "crl_prev_" + "s" * 43


def test_the_token_parameter_is_taken_out_of_the_target_and_the_rest_kept() -> None:
    assert wire.strip_token(f"/a?corral_preview_token={SECRET}".encode()) == (b"/a", SECRET)
    assert wire.strip_token(f"/a?x=1&corral_preview_token={SECRET}&y=2".encode()) == (b"/a?x=1&y=2", SECRET)
    assert wire.strip_token(b"/a?x=1") == (b"/a?x=1", None)
    assert wire.strip_token(b"/a") == (b"/a", None)
    # Spelled with percent-encoding, twice, it is still the token, and every copy goes.
    encoded = f"/?corral%5Fpreview%5Ftoken=x&corral_preview_token={SECRET}".encode()
    assert wire.strip_token(encoded) == (b"/", SECRET)


def test_the_preview_s_cookies_are_told_apart_from_the_page_s() -> None:
    ours, others = wire.split_cookies([b"theme=dark; corral_preview_abc=" + SECRET.encode(), b"b=2;corral_preview_=x"])
    assert ours == {"prv_abc": SECRET}
    assert others == ("theme=dark", "b=2")  # a malformed cookie of ours is dropped, never passed on


def test_presented_collects_every_way_in() -> None:
    headers = [(b"host", b"h"), (b"X-Corral-Preview-Token", SECRET.encode()), (b"cookie", b"corral_preview_p1=v; t=1")]
    seen = wire.presented(b"/p?corral_preview_token=q&k=v", headers)
    assert (seen.query_token, seen.header_token, seen.cookies) == ("q", SECRET, {"prv_p1": "v"})
    assert (seen.target, seen.other_cookies) == (b"/p?k=v", ("t=1",))


def test_the_server_gets_no_secret_and_the_gateway_s_forwarding_headers() -> None:
    headers = [
        (b"host", b"3000-ab.localhost:8701"),
        (b"x-corral-preview-token", SECRET.encode()),
        (b"cookie", b"corral_preview_p1=" + SECRET.encode()),
        (b"connection", b"keep-alive, x-hop"),
        (b"x-hop", b"1"),
        (b"keep-alive", b"timeout=5"),
        (b"expect", b"100-continue"),
        (b"x-forwarded-for", b"6.6.6.6"),
        (b"accept", b"*/*"),
    ]
    out = wire.request_headers(headers, ("t=1",), "127.0.0.1")
    assert SECRET.encode() not in b"".join(k + v for k, v in out)
    assert out == [
        (b"host", b"3000-ab.localhost:8701"),
        (b"accept", b"*/*"),
        (b"cookie", b"t=1"),
        (b"x-forwarded-for", b"127.0.0.1"),
        (b"x-forwarded-host", b"3000-ab.localhost:8701"),
        (b"x-forwarded-proto", b"http"),
    ]


def test_an_upgrade_keeps_its_connection_and_upgrade_headers() -> None:
    headers = [(b"host", b"h"), (b"connection", b"Upgrade"), (b"upgrade", b"websocket"), (b"sec-websocket-key", b"k")]
    assert wire.wants_upgrade(headers)
    out = wire.request_headers(headers, (), "::1")
    assert (
        (b"connection", b"upgrade") in out and (b"upgrade", b"websocket") in out and (b"sec-websocket-key", b"k") in out
    )


def test_the_client_gets_no_cookie_of_the_preview_s_name_from_the_server() -> None:
    headers = [
        (b"content-type", b"text/html"),
        (b"set-cookie", b"corral_preview_p1=attacker; Path=/"),
        (b"set-cookie", b"theme=dark"),
        (b"connection", b"close"),
        (b"transfer-encoding", b"chunked"),
    ]
    out = wire.response_headers(headers)
    assert out == [(b"content-type", b"text/html"), (b"set-cookie", b"theme=dark"), (b"transfer-encoding", b"chunked")]
    switching = wire.response_headers([(b"connection", b"Upgrade"), (b"upgrade", b"websocket")], switching=True)
    assert switching == [(b"connection", b"Upgrade"), (b"upgrade", b"websocket")]


def test_the_first_visit_s_cookie_and_redirect() -> None:
    cookie = wire.set_cookie("prv_abc", SECRET, 120)
    assert cookie == f"corral_preview_abc={SECRET}; Path=/; Max-Age=120; HttpOnly; SameSite=Lax".encode()
    assert b"Domain" not in cookie  # host-only: no other preview's host gets it
    answer = wire.redirect(b"/p?k=v", cookie)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 303 See Other\r\n") and body == b""
    assert b"\r\nlocation: /p?k=v\r\n" in head and b"\r\nset-cookie: " + cookie + b"\r\n" in head
    assert b"connection: close" in head and b"cache-control: no-store" in head


def test_errors_are_json_or_a_page_for_a_browser() -> None:
    answer = wire.error_answer(502, "nothing_listening", "connection refused on port 3000", as_html=False)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and f"content-length: {len(body)}".encode() in head
    assert json.loads(body) == {
        "ok": False,
        "error": {"code": "nothing_listening", "message": "connection refused on port 3000"},
    }
    page = wire.error_answer(401, "unauthorized", "<script>x</script>", as_html=True)
    assert b"text/html" in page and b"&lt;script&gt;" in page and b"<script>x" not in page
    assert wire.wants_html([(b"accept", b"text/html,application/xhtml+xml")])
    assert not wire.wants_html([(b"accept", b"application/json")])


def test_the_first_visit_s_location_never_leaves_the_host() -> None:
    assert wire.same_host(b"/a/b?keep=me") == b"/a/b?keep=me"
    assert wire.same_host(b"//evil.invalid/x?k=1") == b"/x?k=1"  # protocol-relative to a browser
    assert wire.same_host(b"/\\evil.invalid/") == b"/evil.invalid/"  # a backslash is read as a slash
    assert wire.same_host(b"http://evil.invalid/x?y") == b"/x?y"  # absolute-form
    assert wire.same_host(b"/a//b") == b"/a//b"
