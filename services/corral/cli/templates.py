"""``corral template ...``: build (the context packed here and sent to the gateway; its progress
printed as it comes), list and remove templates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from corral import templatecontext
from corral.cli import common
from corral.errors import InvalidRequest

template_app = typer.Typer(
    help="Build, list and remove templates (the base image plus your packages and files).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@template_app.command("build")
def template_build(
    name: Annotated[str, typer.Argument(help="The template's name (lowercase letters, digits, . _ -).")],
    file: Annotated[
        Path, typer.Option("-f", "--file", help="corral.template.yaml, or a Dockerfile FROM corral-desktop:latest.")
    ],
    context: Annotated[
        Path | None, typer.Option("--context", help="The directory its files come from (default: none).")
    ] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Build NAME (a new version when anything changed; the same one back when nothing did)."""
    try:
        packed, inside = templatecontext.pack(file, context)
    except OSError as exc:
        raise common.fail(f"cannot read {exc.filename}: {exc.strerror}", 2) from None
    except InvalidRequest as exc:
        raise common.fail(exc.message, 2) from None
    with common.gateway_call() as gateway:
        built = gateway.build_template(
            name, packed, inside, progress=lambda line: common.console.print(line, markup=False, highlight=False)
        )
    if as_json:
        common.out.print_json(built.model_dump_json())
        return
    again = " (cached: nothing changed)" if built.cached else ""
    common.out.print(f"{built.name}:{built.version} {built.image}{again}", markup=False)


@template_app.command("list")
def template_list(as_json: common.JsonOpt = False) -> None:
    """Every template (any key may start sessions from any; its builder rebuilds and removes it)."""
    with common.gateway_call() as gateway:
        templates = gateway.templates()
    if as_json:
        common.out.print_json(json.dumps([t.model_dump(mode="json") for t in templates]))
        return
    table = Table("name", "latest", "versions", "mine", "size")
    for t in templates:
        newest = t.versions[-1] if t.versions else None
        size = f"{newest.size >> 20} MiB" if newest is not None else "-"
        versions = ",".join(str(v.version) for v in t.versions)
        table.add_row(t.name, str(t.latest), versions, "yes" if t.mine else "no", size)
    common.out.print(table)


@template_app.command("rm")
def template_rm(
    ref: Annotated[str, typer.Argument(help="NAME (every version) or NAME:VERSION.")],
) -> None:
    """Remove a template you built, or one of its versions."""
    name, sep, version = ref.partition(":")
    if sep and not version.isdigit():
        raise common.fail("a version is a whole number: NAME:VERSION", 2)
    with common.gateway_call() as gateway:
        gateway.delete_template(name, int(version) if sep else None)
    common.out.print(f"removed {ref}", markup=False)
