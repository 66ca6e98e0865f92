"""Port previews (docs/previews.md): what the gateway, the controller and the clients agree on.

A preview's host name is ``{port}-{session hex}.{domain}`` (E2B's ``get_host`` form: the session id
without its ``ses_``, since ``_`` is no host-name character), served by the gateway's preview
listener. The gateway reaches the sandbox's server through the controller's ``WS /v1/tunnel/{port}``,
raw bytes as binary frames, closed with :data:`CLOSE_NOTHING_LISTENS` when nothing listens there.
Standard library only, pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

SECRET_PREFIX: Final = "crl_prev_"
ID_PREFIX: Final = "prv_"
SESSION_PREFIX: Final = "ses_"
# Where a preview's secret may ride: the first visit's query parameter (the URL a create answers),
# then the cookie it sets; a programmatic client may send the header instead. The gateway strips all
# three before a request reaches the agent's server.
TOKEN_PARAM: Final = "corral_preview_token"
TOKEN_HEADER: Final = "x-corral-preview-token"
COOKIE_PREFIX: Final = "corral_preview_"

# The controller's close codes on WS /v1/tunnel/{port}.
CLOSE_NOTHING_LISTENS: Final = 4502  # connection refused on the port (the reason says so)
CLOSE_RESERVED_PORT: Final = 4403  # a port no preview may reach (RESERVED_PORTS)
CLOSE_BAD_PORT: Final = 4400  # not a port number 1..65535

CONTROLLER_PORT: Final = 8765
DEVTOOLS_PORT: Final = 9222
# The port the sandbox's own browser reaches previews on (the in-sandbox side, docs/previews.md):
# the same number as the gateway's default, so a preview URL reads the same inside and out.
SANDBOX_PREVIEW_PORT: Final = 8701
# Ports inside the sandbox a preview never reaches: the controller (its routes are the gateway's
# alone), Chromium's DevTools (the whole browser), the in-sandbox preview listener (a loop).
RESERVED_PORTS: Final = frozenset({CONTROLLER_PORT, DEVTOOLS_PORT, SANDBOX_PREVIEW_PORT})

TUNNEL_PATH: Final = "/v1/tunnel/{port}"
TUNNEL_CHUNK_BYTES: Final = 256 << 10  # the largest binary frame either side of a tunnel sends

_SESSION_HEX = re.compile(r"[0-9a-f]{1,64}")
_HOST = re.compile(r"(?P<port>[1-9][0-9]{0,4})-(?P<hex>[0-9a-f]{1,64})")


@dataclass(frozen=True, slots=True)
class PreviewHost:
    """What a preview's host name says: the port in the sandbox and its session's id."""

    port: int
    session_id: str

    def name(self, domain: str) -> str:
        return f"{self.port}-{self.session_id.removeprefix(SESSION_PREFIX)}.{domain}"


def port_problem(port: int) -> str | None:
    """Why ``port`` can never be previewed (not a port, or reserved); None when it may be."""
    if not 1 <= port <= 65535:
        return f"port {port} is not 1..65535"
    if port in RESERVED_PORTS:
        return f"port {port} is reserved inside the sandbox (the controller's, DevTools' or the preview listener's)"
    return None


def host_name(port: int, session_id: str, domain: str) -> str:
    """``{port}-{session hex}.{domain}``; ValueError for a session id without its hex form."""
    hexpart = session_id.removeprefix(SESSION_PREFIX)
    if not session_id.startswith(SESSION_PREFIX) or _SESSION_HEX.fullmatch(hexpart) is None:
        raise ValueError(f"{session_id!r} is not a session id (ses_ and hex)")
    return PreviewHost(port, session_id).name(domain)


def parse_host(header: str, domain: str) -> PreviewHost | None:
    """The preview a ``Host`` header names under ``domain`` (its ``:port`` ignored, any case), or
    None when it names none: another domain, a deeper or shallower name, a port out of range."""
    name = header.strip().lower()
    if name.startswith("["):
        return None  # an IPv6 literal names no preview
    name = name.rsplit(":", 1)[0] if ":" in name else name
    name = name.removesuffix(".")
    suffix = "." + domain.lower().removesuffix(".")
    if not name.endswith(suffix):
        return None
    label = name[: -len(suffix)]
    match = _HOST.fullmatch(label)
    if match is None:
        return None
    port = int(match["port"])
    if port > 65535:
        return None
    return PreviewHost(port, SESSION_PREFIX + match["hex"])


def cookie_name(preview_id: str) -> str:
    """The cookie a preview's secret is kept in (one per preview: a host may hold several over time)."""
    return COOKIE_PREFIX + preview_id.removeprefix(ID_PREFIX)


def preview_id_of_cookie(name: str) -> str | None:
    """The preview id a cookie of ours names, or None for anyone else's cookie."""
    if not name.startswith(COOKIE_PREFIX):
        return None
    rest = name[len(COOKIE_PREFIX) :]
    return ID_PREFIX + rest if rest and rest.isalnum() else None


__all__ = [
    "CLOSE_BAD_PORT",
    "CLOSE_NOTHING_LISTENS",
    "CLOSE_RESERVED_PORT",
    "RESERVED_PORTS",
    "PreviewHost",
    "cookie_name",
    "host_name",
    "parse_host",
    "port_problem",
    "preview_id_of_cookie",
]
