"""What every command group shares: the two consoles, a clean failure, the gateway (its URL, its
key, one call of its HTTP API or a session's WebSocket), the Docker runtime of the server commands,
and the cells of the tables.

The command modules reach these through the module (``common.out``, ``common.gateway_call()``), so
a test swaps one here (``common.gateway``, ``common.sandbox_client``, ``common.runtime``) for all."""

from __future__ import annotations

import contextlib
import importlib.util
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from corral import envlines, gateway_client
from corral.cli import extras
from corral.client import SandboxClient
from corral.errors import CorralError, GatewayError
from corral.gateway_client import Gateway

if TYPE_CHECKING:
    from corral.runtime.docker import DockerRuntime

GATEWAY_CONTAINER = "corral-gateway"
KEY_PATH = "/var/lib/corral/api_key"

console = Console(stderr=True)
out = Console()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]{escape(message)}[/red]")
    return typer.Exit(code)


@contextlib.contextmanager
def needed(extra: str, command: str) -> Iterator[None]:
    """What ``corral command`` imports of ``extra`` (itself or through :func:`runtime`): one of the
    extra's modules missing is a clean failure that names the extra and the pip line that adds it
    (:mod:`corral.cli.extras`)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        message = extras.missing(exc, extra, command)
        if message is None:
            raise
        raise fail(message) from None


def runtime() -> DockerRuntime:
    """The Docker runtime of the server commands; the ``server`` extra brings the Docker SDK, so they
    call this under :func:`needed`."""
    from corral.runtime.docker import DockerRuntime

    try:
        return DockerRuntime()
    except CorralError as exc:
        raise fail(str(exc)) from None


def _file_settings() -> None:
    """The gateway's port and key from ``corral.env`` at the checkout's root, where the shell sets
    neither: `corral up` started the gateway from that file, so `status` and the client commands
    find it there too."""
    envlines.take_client_settings(envlines.checkout_root())  # None from a wheel: the shell only


def url() -> str:
    _file_settings()
    return gateway_client.gateway_url()


def _stored_key() -> str | None:
    """The key the compose gateway keeps in its container; none to read on a client install, which
    has no Docker SDK (and no gateway of its own)."""
    if importlib.util.find_spec("docker") is None:
        return None
    return runtime().read_file(GATEWAY_CONTAINER, KEY_PATH)


def api_key() -> str:
    """The SDK's key (``CORRAL_API_KEY``, from the shell or ``corral.env``), else the one the compose
    gateway keeps in its container."""
    _file_settings()
    try:
        return gateway_client.api_key(stored=_stored_key)
    except CorralError:
        raise fail("no API key: set CORRAL_API_KEY, or start the gateway with `corral up`") from None


def gateway() -> Gateway:
    """The SDK's client of the gateway's HTTP API (tests swap this for one over a fake transport)."""
    return Gateway(url(), api_key())


@contextlib.contextmanager
def gateway_call() -> Iterator[Gateway]:
    """The gateway for one command: a refusal or no answer is a clean failure, never a traceback."""
    try:
        with gateway() as client:
            yield client
    except GatewayError as exc:
        raise fail(str(exc)) from None
    except httpx.HTTPError as exc:
        raise fail(f"no answer from the gateway on {url()} ({exc}); start it with `corral up`") from None


def gateway_get(path: str) -> httpx.Response:
    """GET from the gateway; a gateway that does not answer or answers an error is a clean failure."""
    with gateway_call() as client:
        return client.get(path)


def gateway_download(path: str, local: Path) -> None:
    """GET from the gateway streamed into ``local`` (a log is never held whole); failures as gateway_get's."""
    with gateway_call() as client:
        client.download(path, local)


def gateway_rows(path: str, what: str) -> list[dict[str, Any]]:
    """A gateway listing (a JSON list of objects), or a clean failure naming what was wrong."""
    try:
        rows = gateway_get(path).json()
    except ValueError:
        raise fail(f"the gateway's answer to GET {path} is not JSON") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise fail(f"the gateway's answer to GET {path} is not a list of {what}")
    return rows


def sandbox_client(session_id: str) -> SandboxClient:
    """The session's WebSocket through the gateway, the API key in its handshake's header (tests swap this)."""
    base = url().rstrip("/")
    ws_base = "ws" + base[4:] if base.startswith("http") else base
    quoted = urllib.parse.quote(session_id, safe="")
    return SandboxClient(f"{ws_base}/v1/sessions/{quoted}/ws", headers={"Authorization": f"Bearer {api_key()}"})


def when(seconds: Any) -> str:
    """A unix time as UTC text, as `audit show --since/--until` accept it back."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "-"
    try:
        return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return str(seconds)


def cell(value: Any) -> Text:
    """Log content as plain text: a URL or reason with [brackets] is not rich markup."""
    return Text("-" if value is None or value == "" else str(value))
