"""``corral profile ...``: list, show and remove this API key's saved browser profiles; save a live
session's browser now (its create's ``--profile NAME[:save]`` loads one: ``corral session create``)."""

from __future__ import annotations

import datetime
import json

import typer
from rich.table import Table

from corral.cli import common
from corral.gateway_models import ProfileInfo

profile_app = typer.Typer(
    help="Saved browser profiles (cookies, local storage, IndexedDB) of this API key.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _table(rows: list[ProfileInfo]) -> Table:
    table = Table("name", "size", "saved at (UTC)")
    for row in rows:
        saved = datetime.datetime.fromtimestamp(row.saved_at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(row.name, f"{row.size}", saved)
    return table


@profile_app.command("list")
def profile_list(as_json: common.JsonOpt = False) -> None:
    """This API key's saved profiles: name, size and when saved (never their contents)."""
    with common.gateway_call() as gateway:
        rows = gateway.profiles()
    if as_json:
        common.out.print_json(json.dumps([row.wire() for row in rows]))
    else:
        common.out.print(_table(rows))


@profile_app.command("show")
def profile_show(name: str, as_json: common.JsonOpt = False) -> None:
    with common.gateway_call() as gateway:
        row = gateway.profile(name)
    if as_json:
        common.out.print_json(json.dumps(row.wire()))
    else:
        common.out.print(_table([row]))


@profile_app.command("rm")
def profile_rm(name: str) -> None:
    """Delete a saved profile for good."""
    with common.gateway_call() as gateway:
        gateway.delete_profile(name)
    common.console.print(f"removed profile {name}")


@profile_app.command("save")
def profile_save(session_id: str, as_json: common.JsonOpt = False) -> None:
    """Save a live session's browser now under the profile it was created with (Chromium restarts)."""
    with common.gateway_call() as gateway:
        row = gateway.save_profile(session_id)
    if as_json:
        common.out.print_json(json.dumps(row.wire()))
    else:
        common.out.print(_table([row]))
