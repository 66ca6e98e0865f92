"""``corral audit ...``: list, read, sum up and verify the egress audit logs (a local .jsonl file,
or a session's log streamed from the gateway); the records in words: :mod:`corral.cli.auditwords`."""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from corral.cli import common
from corral.cli.auditwords import records_table

if TYPE_CHECKING:
    from corral.proxy.audit import AnchoredVerification, AuditRecord
    from corral.proxy.traffic import SecretSummary

audit_app = typer.Typer(
    help="Check and read egress audit logs.", no_args_is_help=True, pretty_exceptions_show_locals=False
)


@audit_app.command("verify")
def audit_verify(
    source: Annotated[str, typer.Argument(help="An audit log (.jsonl file) or a session id (ses_...).")],
    anchors: Annotated[
        Path | None,
        typer.Option(
            help="The gateway's anchors of this log (from GET /v1/sessions/ID/traffic.anchors, or "
            "<data_dir>/audit-anchors/ID.jsonl); fetched from the gateway when SOURCE is a session id."
        ),
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(help="The gateway's anchor key (<data_dir>/audit-anchors/key): check each anchor's MAC."),
    ] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Prove an audit log untouched, or name the first record that was changed, removed or moved.

    With the gateway's anchors it also catches a log cut short or rewritten as a whole; without
    them it proves internal consistency only.
    """
    import tempfile

    from corral.proxy.audit import parse_anchors, verify_anchored

    with tempfile.TemporaryDirectory() as scratch:
        path, anchor_lines = _log_and_anchors(source, anchors, Path(scratch))
        try:
            if anchors is not None:
                anchor_lines = anchors.read_bytes().splitlines()
            secret = key.read_bytes() if key is not None else None
        except OSError as exc:
            raise common.fail(f"cannot read {exc.filename}: {exc.strerror or exc}", 2) from None
        try:
            found = parse_anchors(anchor_lines or [], secret)
        except ValueError as exc:
            raise common.fail(f"the anchors are not the gateway's: {exc}") from None
        try:
            result = verify_anchored(path, found)
        except ValueError as exc:
            raise common.fail(str(exc), 2) from None
    if as_json:
        common.out.print_json(json.dumps({**result.to_dict(), "mac_checked": secret is not None}))
    else:
        _print_verdict(result, unchecked_macs=bool(found) and secret is None and anchors is not None)
    if not result.ok:
        raise typer.Exit(1)


def _log_and_anchors(source: str, anchors: Path | None, scratch: Path) -> tuple[Path, list[bytes] | None]:
    """The log to verify, and the gateway's anchors of it when SOURCE is a session id and no
    ``--anchors`` was given: a session's log is streamed from the gateway into ``scratch``."""
    path = Path(source)
    anchor_lines: list[bytes] | None = None
    if source.startswith("ses_") and not path.exists():
        quoted = urllib.parse.quote(source, safe="")
        path = scratch / "audit.jsonl"
        common.gateway_download(f"/v1/sessions/{quoted}/traffic", path)
        if anchors is None:
            # Served only after the gateway checked every anchor's MAC with its key.
            anchor_lines = common.gateway_get(f"/v1/sessions/{quoted}/traffic.anchors").content.splitlines()
    if not path.is_file():
        raise common.fail(f"no audit log at {path}", 2)
    return path, anchor_lines


def _print_verdict(result: AnchoredVerification, unchecked_macs: bool) -> None:
    style = {"intact": "green", "unanchored": "yellow"}.get(result.status, "red")
    label = "ok" if result.status == "intact" else result.status
    common.out.print(Text.assemble((label, style), ": ", result.message))
    if unchecked_macs:
        common.out.print(Text("the anchors' MACs were not checked: give --key to prove they are the gateway's"))


@audit_app.command("show")
def audit_show(
    source: Annotated[str, typer.Argument(help="An audit log (.jsonl file) or a session id (ses_...).")],
    host: Annotated[str | None, typer.Option(help="Only this host; *.example.com for its subdomains.")] = None,
    decision: Annotated[str | None, typer.Option(help="Only allow, deny or report.")] = None,
    event: Annotated[
        str | None,
        typer.Option(help="Only proxy, connect, request, block, error, policy, secrets or secret records."),
    ] = None,
    action: Annotated[str | None, typer.Option(help="Only records of this agent action id.")] = None,
    since: Annotated[
        str | None, typer.Option(help="From this time: unix seconds or ISO 8601 (UTC if no zone).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Up to this time: unix seconds or ISO 8601 (UTC if no zone).")
    ] = None,
    secrets: Annotated[
        bool,
        typer.Option(
            "--secrets", help="Only brokered secrets' records: changes, uses, and requests refused because of one."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the records as JSON Lines for scripts.")] = False,
) -> None:
    """The records of an audit log, filtered: what the session's browser reached, and what was refused."""
    from corral.proxy.traffic import TrafficFilter

    try:
        flt = TrafficFilter.parse(
            host=host, decision=decision, event=event, action=action, since=since, until=until, secrets=secrets
        )
    except ValueError as exc:
        raise common.fail(f"bad filter: {exc}", 2) from None
    with _audit_log_file(source) as log:
        if as_json:
            for record in _audit_records(log):
                if flt.matches(record):
                    # As the log stores them, so a whole unfiltered dump still passes `corral audit verify`.
                    typer.echo(json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
            return
        seen = 0
        shown: list[AuditRecord] = []
        for record in _audit_records(log):
            seen += 1
            if flt.matches(record):
                shown.append(record)
    common.out.print(records_table(shown, seen))


@audit_app.command("summary")
def audit_summary(
    source: Annotated[str, typer.Argument(help="An audit log (.jsonl file) or a session id (ses_...).")],
    as_json: common.JsonOpt = False,
) -> None:
    """Per host: requests let through, blocked, reported (would be denied), errors and bytes; and per
    host and brokered secret: substitutions, reflections scrubbed, misuse and unavailable refusals."""
    from dataclasses import asdict

    from corral.proxy.traffic import summarize, summarize_secrets, totals

    with _audit_log_file(source) as log:
        rows = summarize(_audit_records(log))
        secret_rows = summarize_secrets(_audit_records(log))
    total = totals(rows)
    if as_json:
        answer: dict[str, Any] = {"hosts": [asdict(row) for row in rows], "total": asdict(total)}
        if secret_rows:  # only in logs of sessions that used secrets
            answer["secrets"] = [asdict(row) for row in secret_rows]
        common.out.print_json(json.dumps(answer))
        return
    table = Table("host", "requests", "blocked", "reported", "errors", "bytes in", "bytes out")
    for column in table.columns[1:]:
        column.justify = "right"
    for row in [*rows, total]:
        if row is total:
            table.add_section()
        table.add_row(
            Text(row.host, style="bold" if row is total else ""),
            *(
                f"{value:,}"
                for value in (row.requests, row.blocked, row.reported, row.errors, row.bytes_in, row.bytes_out)
            ),
            style="bold" if row is total else None,
        )
    common.out.print(table)
    if secret_rows:
        common.out.print(_secrets_table(secret_rows))


def _secrets_table(rows: list[SecretSummary]) -> Table:
    table = Table(
        "host",
        "secret",
        "substitutions",
        "reflections scrubbed",
        "misuse blocks",
        "exfiltration",
        "unavailable",
        title="brokered secrets",
    )
    for column in table.columns[2:]:
        column.justify = "right"
    for row in rows:
        table.add_row(
            Text(row.host),
            Text(row.secret or "-"),
            *(
                f"{value:,}"
                for value in (row.substitutions, row.reflections, row.misuse, row.exfiltration, row.unavailable)
            ),
        )
    return table


@audit_app.command("ls")
def audit_ls(as_json: common.JsonOpt = False) -> None:
    """The audit logs the gateway keeps, of live and ended sessions."""
    rows = common.gateway_rows("/v1/audit", "audit logs")
    if as_json:
        common.out.print_json(json.dumps(rows))
        return
    table = Table("session", "state", "created", "ended", "records", "bytes")
    table.columns[0].no_wrap = True  # ids are copied from here
    for column in table.columns[4:]:
        column.justify = "right"
    for row in rows:
        table.add_row(
            common.cell(row.get("session")),
            common.cell(row.get("state")),
            common.when(row.get("created_at")),
            common.when(row.get("ended_at")),
            common.cell(row.get("records")),
            common.cell(row.get("bytes")),
        )
    common.out.print(table)


@contextlib.contextmanager
def _audit_log_file(source: str) -> Iterator[tuple[Path, str]]:
    """A local audit log and how to name it: the file given, or a session's log streamed from the
    gateway into a scratch file."""
    import tempfile

    path = Path(source)
    if source.startswith("ses_") and not path.exists():
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / "audit.jsonl"
            common.gateway_download(f"/v1/sessions/{urllib.parse.quote(source, safe='')}/traffic", local)
            yield local, f"session {source}"
        return
    if not path.is_file():
        raise common.fail(f"no audit log at {path} (give a .jsonl file or a session id, ses_...)", 2)
    yield path, str(path)


def _audit_records(log: tuple[Path, str]) -> Iterator[AuditRecord]:
    """The records of a local audit log, read lazily, one bounded line at a time; an unreadable one
    is a clean failure."""
    from corral.proxy.audit import bounded_lines
    from corral.proxy.traffic import parse_records

    path, name = log
    try:
        with path.open("rb") as lines:
            yield from parse_records(bounded_lines(lines), source=name)
    except ValueError as exc:
        message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
        raise common.fail(f"not an audit log: {message}") from None
    except OSError as exc:
        raise common.fail(f"cannot read {path}: {exc.strerror or exc}") from None
