"""``corral volume ...``: the API key's workspace volumes (create, list, rm); a session takes one
with ``corral session create --volume NAME``."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.table import Table

from corral.cli import common
from corral.gateway_models import VolumeInfo

volume_app = typer.Typer(
    help="Workspace volumes: /workspace kept across sessions.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _volume_table(rows: list[VolumeInfo]) -> Table:
    table = Table("name", "size", "used", "in use by", "age")
    now = time.time()
    for v in rows:
        used = f"{v.used_bytes / (1 << 20):.1f} MiB"
        table.add_row(v.name, f"{v.size_mb} MiB", used, v.in_use_by or "-", f"{now - v.created_at:.0f}s")
    return table


@volume_app.command("create")
def volume_create(
    name: Annotated[str, typer.Argument(help="Its name: lowercase letters, digits, '.', '_', '-'.")],
    size_mb: Annotated[
        int | None, typer.Option("--size-mb", help="Its quota in MiB (the gateway's default when not given).")
    ] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Make a volume: an empty filesystem of its own, mounted at /workspace by a session that names it."""
    with common.gateway_call() as gateway:
        made = gateway.create_volume(name, size_mb)
    if as_json:
        common.out.print_json(json.dumps(made.wire()))
        return
    common.out.print(_volume_table([made]))


@volume_app.command("list")
def volume_list(as_json: common.JsonOpt = False) -> None:
    """The key's volumes: size, what their filesystem uses, the session holding each."""
    with common.gateway_call() as gateway:
        rows = gateway.volumes()
    if as_json:
        common.out.print_json(json.dumps([v.wire() for v in rows]))
        return
    common.out.print(_volume_table(rows))


@volume_app.command("rm")
def volume_rm(name: Annotated[str, typer.Argument(help="The volume to delete, with everything in it.")]) -> None:
    """Delete a volume and its files (refused while a session holds it)."""
    with common.gateway_call() as gateway:
        gateway.delete_volume(name)
    common.out.print(f"deleted volume {name}")
