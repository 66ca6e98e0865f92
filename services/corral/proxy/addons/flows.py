"""How the egress addons read a mitmproxy flow: its URL by the vetted name, its headers as pairs,
the address at the other end of a connection."""

from __future__ import annotations

from mitmproxy import connection, http


def url_of(request: http.Request, host: str) -> str:
    """The URL as the client asked for it: by name, not by the address it was pinned to."""
    default = {"http": 80, "https": 443}.get(request.scheme)
    authority = f"[{host}]" if ":" in host else host
    if request.port != default:
        authority += f":{request.port}"
    return f"{request.scheme}://{authority}{request.path}"


def header_pairs(headers: http.Headers) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers.fields]


def peer(conn: connection.Connection) -> str | None:
    return str(conn.peername[0]) if conn.peername else None
