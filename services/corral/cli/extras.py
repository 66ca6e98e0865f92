"""Which of the package's extras a missing module belongs to, and the line that installs it.

A plain ``pip install`` of Corral is the client (the SDK, the client commands); the commands that
run the gateway or need a heavy library import it inside the command (``common.needed``), so a
client install that lacks it says which extra to add instead of raising an ImportError.
"""

from __future__ import annotations

import importlib.metadata
import json
import urllib.parse
import urllib.request

# The top-level modules each extra brings (pyproject.toml's optional-dependencies): a missing one of
# these means the extra is not installed; any other missing module is a bug, raised as it is.
MODULES: dict[str, frozenset[str]] = {
    "server": frozenset(
        {"docker", "fastapi", "starlette", "uvicorn", "prometheus_client", "pydantic_settings", "cryptography", "Xlib"}
    ),
    "mcp": frozenset({"mcp", "mcp_types", "starlette", "sse_starlette", "anyio", "jwt", "jsonschema"}),
    "video": frozenset({"imageio_ffmpeg", "PIL"}),
    "replay": frozenset({"PIL", "Xlib"}),
}

# Shown when pip did not record where this corral came from (an install by other means).
_SOMEWHERE = "path/to/corral"


def install_line(extra: str) -> str:
    """The pip command that adds ``extra`` to this install: from the checkout or the wheel pip
    installed it from (its ``direct_url.json``, PEP 610); no package index serves Corral."""
    source, editable = _installed_from()
    return f"pip install {'-e ' if editable else ''}'{source}[{extra}]'"


def _installed_from() -> tuple[str, bool]:
    try:
        recorded = importlib.metadata.distribution("corral").read_text("direct_url.json")
        direct = json.loads(recorded or "")
        url = str(direct["url"])
        editable = bool((direct.get("dir_info") or {}).get("editable"))
    except (importlib.metadata.PackageNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return _SOMEWHERE, False
    if url.startswith("file:"):
        return urllib.request.url2pathname(urllib.parse.urlparse(url).path), editable
    return url, editable


def missing(exc: ModuleNotFoundError, extra: str, command: str) -> str | None:
    """What to tell the user when ``command`` met ``exc``: None unless the missing module is one
    that ``extra`` brings (any other is a bug, to be raised as it is)."""
    if (exc.name or "").split(".")[0] not in MODULES[extra]:
        return None
    return f"`corral {command}` needs Corral's {extra} extra (no module named {exc.name!r} here): {install_line(extra)}"
