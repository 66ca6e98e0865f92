"""What the preview listener reads and rewrites of HTTP/1.1, pure: the secret a request presents
(query parameter, header, cookie) and the request with every trace of it removed, the headers the
agent's server gets and the ones a client gets back, the cookie and redirect of a first visit, and
the error answers (JSON, or a small page for a browser).

The agent's server never sees the preview's secret: its query parameter, its header and its cookie
are taken out of each request before it is forwarded, and a ``Set-Cookie`` of the server's that
names one of the gateway's cookies is dropped (it could log a viewer out, or fix a cookie of its own).
"""

from __future__ import annotations

import html
import json
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from corral.contracts.previews import COOKIE_PREFIX, TOKEN_HEADER, TOKEN_PARAM, cookie_name, preview_id_of_cookie
from corral.errors import error_body

Headers = list[tuple[bytes, bytes]]

# Hop-by-hop headers (RFC 9110 7.6.1): the listener's own business on each side, never passed on.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"trailer", b"upgrade"}
)
# Said by the gateway itself to the agent's server (what a client sends of them is replaced).
FORWARDED = frozenset({b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto", b"forwarded"})


@dataclass(frozen=True, slots=True)
class Presented:
    """The secrets a request carries, and the request without them."""

    query_token: str | None  # ?corral_preview_token= (the first visit)
    header_token: str | None  # X-Corral-Preview-Token (a programmatic client)
    cookies: dict[str, str] = field(default_factory=dict)  # preview id -> its cookie's value
    target: bytes = b"/"  # the request target, the token's parameter removed
    other_cookies: tuple[str, ...] = ()  # every other cookie, as sent, for the server


def strip_token(target: bytes) -> tuple[bytes, str | None]:
    """The target without :data:`TOKEN_PARAM` (every occurrence), and the token's (last) value."""
    text = target.decode("latin-1")
    path, mark, query = text.partition("?")
    if not mark:
        return target, None
    token = None
    kept = []
    for part in query.split("&"):
        name = urllib.parse.unquote_plus(part.partition("=")[0])
        if name == TOKEN_PARAM:
            token = urllib.parse.unquote_plus(part.partition("=")[2])
            continue
        kept.append(part)
    if token is None:
        return target, None
    rest = "&".join(kept)
    return (path + ("?" + rest if rest else "")).encode("latin-1"), token


def split_cookies(values: Iterable[bytes]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The ``Cookie`` headers' pairs: the previews' (by preview id) and everyone else's, as sent."""
    ours: dict[str, str] = {}
    others: list[str] = []
    for value in values:
        for pair in value.decode("latin-1").split(";"):
            pair = pair.strip()
            if not pair:
                continue
            name, _, cookie = pair.partition("=")
            preview_id = preview_id_of_cookie(name.strip())
            if preview_id is not None:
                ours[preview_id] = cookie.strip().strip('"')
            elif not name.strip().startswith(COOKIE_PREFIX):
                others.append(pair)
    return ours, tuple(others)


def presented(target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> Presented:
    stripped, query_token = strip_token(target)
    header_token = next((v.decode("latin-1").strip() for k, v in headers if k.lower() == TOKEN_HEADER.encode()), None)
    ours, others = split_cookies(v for k, v in headers if k.lower() == b"cookie")
    return Presented(query_token, header_token or None, ours, stripped, others)


def header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for k, v in headers if k.lower() == name), None)


def _connection_tokens(headers: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
    tokens: set[bytes] = set()
    for k, v in headers:
        if k.lower() == b"connection":
            tokens |= {t.strip().lower() for t in v.split(b",") if t.strip()}
    return tokens


def wants_upgrade(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    return b"upgrade" in _connection_tokens(headers) and header(headers, b"upgrade") is not None


def request_headers(
    headers: Sequence[tuple[bytes, bytes]], cookies: Sequence[str], remote_ip: str, proto: str = "http"
) -> Headers:
    """The headers the agent's server gets: hop-by-hop ones and those the connection names dropped
    (an upgrade's ``Connection``/``Upgrade`` kept), the preview's header and cookie removed (the
    other cookies kept as one header), ``Expect`` answered by the gateway, ``X-Forwarded-*`` its own."""
    upgrade = wants_upgrade(headers)
    dropped = HOP_BY_HOP | _connection_tokens(headers) | FORWARDED | {b"cookie", b"expect", TOKEN_HEADER.encode()}
    out: Headers = [(k, v) for k, v in headers if k.lower() not in dropped]
    if cookies:
        out.append((b"cookie", "; ".join(cookies).encode("latin-1")))
    if upgrade:
        out += [(b"connection", b"upgrade"), (b"upgrade", header(headers, b"upgrade") or b"")]
    host = header(headers, b"host") or b""
    out += [
        (b"x-forwarded-for", remote_ip.encode()),
        (b"x-forwarded-host", host),
        (b"x-forwarded-proto", proto.encode()),
    ]
    return out


def _sets_our_cookie(value: bytes) -> bool:
    name = value.split(b"=", 1)[0].strip().decode("latin-1")
    return name.startswith(COOKIE_PREFIX)


def response_headers(headers: Sequence[tuple[bytes, bytes]], switching: bool = False) -> Headers:
    """The headers a client gets from the agent's server: hop-by-hop ones dropped (the listener
    frames the answer itself; a 101 keeps its ``Connection``/``Upgrade``), and any ``Set-Cookie``
    of a preview's cookie name."""
    dropped = (HOP_BY_HOP - {b"connection", b"upgrade"}) if switching else HOP_BY_HOP | _connection_tokens(headers)
    return [
        (k, v)
        for k, v in headers
        if k.lower() not in dropped and not (k.lower() == b"set-cookie" and _sets_our_cookie(v))
    ]


def set_cookie(preview_id: str, secret: str, max_age_s: int) -> bytes:
    """The first visit's cookie: host-only (no Domain), every path, HttpOnly (no script of the page
    reads it), SameSite=Lax (no other site's subrequest carries it), gone with the preview's expiry."""
    return f"{cookie_name(preview_id)}={secret}; Path=/; Max-Age={max(max_age_s, 0)}; HttpOnly; SameSite=Lax".encode()


def answer(status: int, reason: str, headers: Headers, body: bytes) -> bytes:
    """A whole HTTP/1.1 answer that ends the connection (errors and the first visit's redirect)."""
    lines = [f"HTTP/1.1 {status} {reason}".encode()]
    lines += [k + b": " + v for k, v in headers]
    lines += [b"content-length: " + str(len(body)).encode(), b"connection: close", b"cache-control: no-store"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def same_host(target: bytes) -> bytes:
    """A request target as a redirect's ``Location`` on the same host: its path and query only.
    ``//other/`` is a protocol-relative address to a browser (``/\\other/`` too: browsers read a
    backslash as a slash), and an absolute-form target names its own host: neither may leave."""
    parts = urllib.parse.urlsplit(target.decode("latin-1"))
    path = "/" + parts.path.lstrip("/\\")
    return (path + ("?" + parts.query if parts.query else "")).encode("latin-1")


def redirect(location: bytes, cookie: bytes) -> bytes:
    """303 to ``location`` (the URL without the token), the cookie set: the token leaves the address
    bar and the history at once."""
    return answer(
        303, "See Other", [(b"location", location), (b"set-cookie", cookie), (b"referrer-policy", b"no-referrer")], b""
    )


REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    410: "Gone",
    413: "Content Too Large",
    421: "Misdirected Request",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


def wants_html(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    accept = (header(headers, b"accept") or b"").lower()
    return b"text/html" in accept


def error_answer(status: int, code: str, message: str, as_html: bool) -> bytes:
    """The listener's error, the API's JSON error body, or a small page for a browser; the message
    is the gateway's own words (never the agent's server's)."""
    reason = REASONS.get(status, "Error")
    if as_html:
        text = html.escape(message)
        page = (
            f"<!doctype html><meta charset=utf-8><title>{status} {reason}</title>"
            f"<h1>{status} {reason}</h1><p>{text}</p><p><code>{html.escape(code)}</code> (Corral port preview)</p>"
        )
        body, media = page.encode(), b"text/html; charset=utf-8"
    else:
        body, media = json.dumps(error_body(code, message)).encode(), b"application/json"
    return answer(status, reason, [(b"content-type", media), (b"x-content-type-options", b"nosniff")], body)
