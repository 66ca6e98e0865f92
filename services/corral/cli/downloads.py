"""``corral downloads ...``: what a session's browser downloaded, whoever started it (docs/downloads.md):
list (each one's name, size, state and cause), get (one's bytes saved to a file here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from corral.cli import common
from corral.contracts.downloads import safe_name
from corral.protocol.downloads import Download

downloads_app = typer.Typer(
    help="The browser's downloads: list them, get one's bytes (the owner's API key or the session's token).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def cause_text(row: Download) -> str:
    """What caused a download, in words: ``navigate a3.beef``, ``cdp:c1``, ``browser``."""
    cause = row.cause
    if cause.kind == "action":
        return " ".join(part for part in (cause.action, cause.action_id) if part)
    if cause.kind == "cdp":
        return cause.actor or "cdp"
    return "browser"


def _table(rows: list[Download]) -> Table:
    table = Table("id", "name", "size", "type", "state", "cause", "started", "url")
    for row in rows:
        state = row.state if row.error is None else f"{row.state}: {row.error}"
        table.add_row(
            row.id,
            common.cell(row.name),
            str(row.size),
            common.cell(row.mime_type),
            common.cell(state),
            common.cell(cause_text(row)),
            common.when(row.started_at),
            common.cell(row.url),
        )
    return table


@downloads_app.command("list")
def downloads_list(session_id: str, as_json: common.JsonOpt = False) -> None:
    """A session's downloads, oldest first, with the caps."""
    with common.gateway_call() as gateway:
        listing = gateway.downloads(session_id)
    if as_json:
        common.out.print_json(json.dumps(listing.model_dump(mode="json")))
    else:
        common.out.print(_table(listing.downloads))


@downloads_app.command("get")
def downloads_get(
    session_id: str,
    download_id: str,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where to save it (default: its name, here).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a file already there.")] = False,
) -> None:
    """Save a completed download's bytes to a file (streamed; the file appears only once whole)."""
    with common.gateway_call() as gateway:
        if output is None:
            found = next((row for row in gateway.downloads(session_id).downloads if row.id == download_id), None)
            output = Path(safe_name(found.name if found is not None else download_id))
        if output.exists() and not force:
            raise common.fail(f"{output} exists: give --force to replace it, or --output elsewhere")
        saved = gateway.save_download(session_id, download_id, output)
    common.console.print(f"saved {saved.size} bytes to {saved.path}", markup=False, highlight=False)
