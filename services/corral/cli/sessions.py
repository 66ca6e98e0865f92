"""``corral session ...``: create, list, show, change and remove sessions through the gateway."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from corral import gateway_client
from corral.cli import common

session_app = typer.Typer(
    help="Create, list, show and remove sessions.", no_args_is_help=True, pretty_exceptions_show_locals=False
)


def _session_table(rows: list[dict[str, Any]]) -> Table:  # a paused session's "expires in" stands still
    # The node column only from a gateway of several machines (a single host names none).
    nodes = any(s.get("node") for s in rows)
    table = Table("id", "state", *(["node"] if nodes else []), "age", "expires in", "viewport", "allow", "labels")
    table.columns[0].no_wrap = True  # ids are copied from here
    now = time.time()
    for s in rows:
        table.add_row(
            s["id"],
            s["state"],
            *([s.get("node") or "-"] if nodes else []),
            f"{now - s['created_at']:.0f}s",
            f"{s['expires_at'] - now:.0f}s",
            f"{s['viewport']['width']}x{s['viewport']['height']}",
            ",".join(s["allow"]) or "-",
            ",".join(f"{k}={v}" for k, v in s["labels"].items()) or "-",
        )
    return table


@session_app.command("create")
def session_create(
    allow: Annotated[list[str] | None, typer.Option("--allow", help="Host the session may reach (repeat).")] = None,
    viewport: Annotated[str, typer.Option(help="WIDTHxHEIGHT")] = "1280x800",
    timeout_s: Annotated[int | None, typer.Option("--timeout", help="Wall-clock limit in seconds.")] = None,
    idle_timeout_s: Annotated[int | None, typer.Option("--idle-timeout", help="Idle limit in seconds.")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="KEY=VALUE (repeat).")] = None,
    egress_mode: Annotated[
        str | None, typer.Option("--egress-mode", help="enforce (default) or report (allow, log what is not allowed).")
    ] = None,
    secrets_file: Annotated[
        Path | None,
        typer.Option(
            "--secrets-file",
            help='JSON: {"NAME": {"value": ..., "allow": [...], "in": [...]}}. The sandbox gets placeholders, '
            "the proxy puts the values in (never give a value on a command line).",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            help="NAME=VALUE in every command's environment (repeat). The agent reads it: never a secret.",
        ),
    ] = None,
    volume: Annotated[
        str | None, typer.Option("--volume", help="A workspace volume (`corral volume create`) at /workspace.")
    ] = None,
    template: Annotated[
        str | None, typer.Option("--template", help="NAME or NAME:VERSION: a template to start from.")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="NAME or NAME:save: a saved browser profile (cookies, local storage) loaded into the browser; "
            ":save saves it again at the session's end (and makes it when missing).",
        ),
    ] = None,
    idle_action: Annotated[
        str | None, typer.Option("--idle-action", help="What the idle timeout does: end (default) or pause.")
    ] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Start a session; prints its id, token and WebSocket URL (and its secrets' placeholders)."""
    width, _, height = viewport.partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise common.fail("viewport must look like 1280x800", 2)
    labels = dict(item.split("=", 1) for item in (label or []) if "=" in item)
    secrets = _secrets_file(secrets_file) if secrets_file is not None else None
    profile_name, save_profile = _profile_option(profile)
    body = gateway_client.session_body(
        allow,
        (int(width), int(height)),
        timeout_s,
        idle_timeout_s,
        labels,
        egress_mode,
        secrets=secrets,
        env=env_pairs(env or []),
        volume=volume,
        template=template,
        profile=profile_name,
        save_profile=save_profile,
        idle_action=idle_action,
    )
    with common.gateway_call() as gateway:
        session = gateway.create_session(body)
    created = session.wire()
    if as_json:
        common.out.print_json(json.dumps(created))
        return
    common.out.print(_session_table([created]))
    common.out.print(f"token: {session.token}\nws: {session.ws_url}")
    for name, placeholder in session.secrets.items():
        common.out.print(f"secret {name}: {placeholder}")


def env_pairs(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` options as a mapping (a later one of a name wins); exits 2 on a malformed
    one without repeating it (its text may be sensitive)."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise common.fail("each --env is NAME=VALUE with a name (one is not; its text is not repeated here)", 2)
        env[name] = value
    return env


@session_app.command("set-timeout")
def session_set_timeout(
    session_id: str,
    seconds: Annotated[int, typer.Argument(help="The session's new remaining lifetime, from now.")],
    as_json: common.JsonOpt = False,
) -> None:
    """End a live session SECONDS from now, longer or shorter than before (at most the gateway's maximum)."""
    with common.gateway_call() as gateway:
        updated = gateway.set_timeout(session_id, seconds).wire()
    if as_json:
        common.out.print_json(json.dumps(updated))
        return
    common.out.print(_session_table([updated]))


def _profile_option(value: str | None) -> tuple[str | None, bool]:
    """``--profile NAME`` or ``NAME:save`` as (name, save)."""
    if value is None:
        return None, False
    name, _, suffix = value.partition(":")
    if suffix not in ("", "save") or not name:
        raise common.fail("--profile takes NAME or NAME:save", 2)
    return name, suffix == "save"


def _json_file(path: Path) -> object:
    """A JSON file; its words on failure never quote the file's content (it holds secret values)."""
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise common.fail(f"cannot read {path}: {exc.strerror}", 2) from None
    except ValueError:
        raise common.fail(f"{path} is not JSON", 2) from None


def _values_file(path: Path) -> dict[str, str]:
    """A resume's secret values, ``{"NAME": "value"}``, from a JSON file."""
    values = _json_file(path)
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise common.fail(f'{path} must hold an object: {{"NAME": "value"}}', 2)
    return {str(name): value for name, value in values.items()}


def _secrets_file(path: Path) -> dict[str, Any]:
    """The ``secrets`` of a create, from a JSON file."""
    secrets = _json_file(path)
    if not isinstance(secrets, dict) or not all(isinstance(spec, dict) for spec in secrets.values()):
        raise common.fail(f'{path} must hold an object: {{"NAME": {{"value": ..., "allow": [...]}}}}', 2)
    return secrets


@session_app.command("secrets")
def session_secrets(session_id: str, as_json: common.JsonOpt = False) -> None:
    """A session's secrets as its sandbox holds them: name and placeholder (values are never shown)."""
    with common.gateway_call() as gateway:
        placeholders = gateway.secrets(session_id)
    if as_json:
        common.out.print_json(json.dumps(placeholders))
        return
    table = Table("secret", "placeholder")
    for name, placeholder in placeholders.items():
        table.add_row(name, placeholder)
    common.out.print(table)


@session_app.command("allow")
def session_allow(
    session_id: str,
    entries: Annotated[list[str] | None, typer.Argument(help="The new allowlist (replaces the old one).")] = None,
    egress_mode: Annotated[str | None, typer.Option("--egress-mode", help="enforce or report.")] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Replace a live session's allowlist (and mode); the change is written to its audit log."""
    with common.gateway_call() as gateway:
        updated = gateway.update_session(session_id, entries or [], egress_mode).wire()
    if as_json:
        common.out.print_json(json.dumps(updated))
        return
    common.out.print(_session_table([updated]))


@session_app.command("ls")
def session_ls(as_json: common.JsonOpt = False) -> None:
    """The sessions of this API key."""
    with common.gateway_call() as gateway:
        rows = [row.wire() for row in gateway.sessions()]
    if as_json:
        common.out.print_json(json.dumps(rows))
    else:
        common.out.print(_session_table(rows))


@session_app.command("show")
def session_show(session_id: str, as_json: common.JsonOpt = False) -> None:
    with common.gateway_call() as gateway:
        row = gateway.session(session_id).wire()
    if as_json:
        common.out.print_json(json.dumps(row))
    else:
        common.out.print(_session_table([row]))


@session_app.command("rm")
def session_rm(session_id: str) -> None:
    with common.gateway_call() as gateway:
        gateway.delete_session(session_id)
    common.console.print(f"removed {session_id}")


@session_app.command("pause")
def session_pause(session_id: str, as_json: common.JsonOpt = False) -> None:
    """Pause a session: its tabs and files saved, its sandbox removed, its slot free until it resumes."""
    with common.gateway_call() as gateway:
        row = gateway.pause_session(session_id).wire()
    if as_json:
        common.out.print_json(json.dumps(row))
    else:
        common.out.print(_session_table([row]))


@session_app.command("resume")
def session_resume(
    session_id: str,
    secrets_file: Annotated[
        Path | None,
        typer.Option(
            "--secrets-file",
            help='JSON: {"NAME": "value"}: the secret values a restarted gateway no longer holds '
            "(it names them; never give a value on a command line).",
        ),
    ] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Resume a paused session: the same id and token, its files and tabs back."""
    values = _values_file(secrets_file) if secrets_file is not None else None
    with common.gateway_call() as gateway:
        row = gateway.resume_session(session_id, values).wire()
    if as_json:
        common.out.print_json(json.dumps(row))
    else:
        common.out.print(_session_table([row]))
