"""``corral preview ...``: a server the agent runs inside a session, opened from outside through the
gateway on an origin of its own (docs/previews.md): create (its URL with the secret, shown once),
list (with each one's use, never a secret), revoke (its open connections closed)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from corral.cli import common
from corral.gateway_models import PreviewInfo

preview_app = typer.Typer(
    help="Port previews: a server inside a session, opened through the gateway (owner's API key).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

TtlOpt = Annotated[
    int | None,
    typer.Option(
        "--ttl",
        min=1,
        max=86_400,
        help="Seconds the preview lives (default an hour; never past the session's end).",
    ),
]


def _state(row: PreviewInfo) -> str:
    return "revoked" if row.revoked_at is not None else f"until {common.when(row.expires_at)}"


def _table(rows: list[PreviewInfo]) -> Table:
    table = Table("id", "port", "host", "state", "last used", "connections", "bytes in", "bytes out")
    for row in rows:
        table.add_row(
            row.id,
            str(row.port),
            common.cell(row.host),
            _state(row),
            common.when(row.last_used_at),
            str(row.connections),
            str(row.bytes_in),
            str(row.bytes_out),
        )
    return table


@preview_app.command("create")
def preview_create(
    session_id: str,
    port: Annotated[int, typer.Argument(min=1, max=65535, help="The port a server listens on inside the session.")],
    ttl: TtlOpt = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Open PORT of a session through the gateway: prints its URL, which carries the preview's secret
    (shown this once: keep it; `preview revoke` ends it)."""
    with common.gateway_call() as gateway:
        made = gateway.create_preview(session_id, port, ttl)
    if as_json:
        common.out.print_json(json.dumps(made.shown()))
        return
    common.out.print(made.url, markup=False, highlight=False, soft_wrap=True)
    common.console.print(
        f"preview {made.id} of port {made.port} until {common.when(made.expires_at)}; "
        f"the sandbox's own browser opens {made.sandbox_url}",
        markup=False,
        highlight=False,
    )


@preview_app.command("list")
def preview_list(session_id: str, as_json: common.JsonOpt = False) -> None:
    """A session's previews: live, expired and revoked, with their use (never a secret)."""
    with common.gateway_call() as gateway:
        rows = gateway.previews(session_id)
    if as_json:
        common.out.print_json(json.dumps({"previews": [row.wire() for row in rows]}))
    else:
        common.out.print(_table(rows))


@preview_app.command("revoke")
def preview_revoke(session_id: str, preview_id: str, as_json: common.JsonOpt = False) -> None:
    """Revoke a preview: its secret refused from now on, its open connections (WebSockets too) closed."""
    with common.gateway_call() as gateway:
        revoked = gateway.revoke_preview(session_id, preview_id)
    if as_json:
        common.out.print_json(json.dumps(revoked.wire()))
    else:
        common.console.print(f"revoked preview {revoked.id}", markup=False, highlight=False)
