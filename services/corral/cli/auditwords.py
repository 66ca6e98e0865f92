"""``corral audit show``'s table: each audit record in words, who acted and what the record says (a
brokered secret's change or use, a policy change, a refusal's rule and reason)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from corral.cli import common

if TYPE_CHECKING:
    from corral.proxy.audit import AuditRecord


DECISION_STYLE = {"allow": "green", "deny": "red", "report": "yellow"}


def _names(value: Any) -> str:
    return ", ".join(str(name) for name in value) if isinstance(value, list) and value else ""


def _secrets_change(record: AuditRecord) -> str:
    """A ``secrets`` record in words: who changed what (names only; a record never holds a value)."""
    parts = [
        f"{what} {names}"
        for what, names in (
            ("added", _names(record.get("added"))),
            ("rotated", _names(record.get("rotated"))),
            ("revoked", _names(record.get("revoked"))),
            ("restored", _names(record.get("restored"))),
        )
        if names
    ]
    bindings = record.get("bindings")
    live = _names(sorted(bindings)) if isinstance(bindings, dict) else ""
    return f"by {record.get('actor') or '?'}: {'; '.join(parts) or 'no change'}; live: {live or 'none'}"


def _secret_use(record: AuditRecord) -> str:
    """Which secret, where, how many times; and for a block whether it was flagged as exfiltration."""
    count = record.get("count")
    times = f" x{count}" if isinstance(count, int) and not isinstance(count, bool) else ""
    flagged = " (exfiltration)" if record.get("exfiltration") is True else ""
    return f"{record.get('secret') or '?'} in {record.get('location') or '?'}{times}{flagged}"


def acted(record: AuditRecord) -> str | None:
    """The action a record is charged to, and who acted in it when not the agent (a human, CDP)."""
    action, actor = record.get("action"), record.get("actor")
    if actor is None or record.get("event") in ("policy", "secrets", "link", "lifetime"):  # there: who made a change
        return action
    return f"{action} ({actor})"


def detail(record: AuditRecord) -> str:
    event = record.get("event")
    if event == "secrets":
        return _secrets_change(record)
    if event == "secret" or (event == "block" and record.get("secret") is not None):
        rule, reason = record.get("rule"), record.get("reason")
        return " — ".join(str(part) for part in (rule, _secret_use(record), reason) if part)
    if event == "error":
        return str(record.get("error") or "")
    if event == "proxy":
        return f"version {record.get('version')}, mode {record.get('mode')}"
    if event == "policy":
        allow = record.get("allow")
        allowed = ", ".join(str(a) for a in allow) if isinstance(allow, list) else ""
        return f"by {record.get('actor') or '?'}: mode {record.get('mode')}, allow {allowed or 'nothing'}"
    if event == "link":
        return f"{record.get('mode')} link {record.get('link')} {record.get('change')} (made by {record.get('actor')})"
    if event == "lifetime":
        expiry, before = record.get("expires_at"), record.get("previous_expires_at")
        return f"by {record.get('actor') or '?'}: the session expires at {expiry} (was {before})"
    if event == "volume":
        used = record.get("used_bytes")
        mib = f"{used / (1 << 20):.1f}" if isinstance(used, int) else "?"
        return f"volume {record.get('volume')} {record.get('change')}: {mib} of {record.get('size_mb')} MiB used"
    if event == "control":
        return f"lease {record.get('change')}: {record.get('previous')} -> {record.get('holder')}"
    rule, reason = record.get("rule"), record.get("reason")
    return " — ".join(str(part) for part in (rule, reason) if part)


def records_table(shown: list[AuditRecord], seen: int) -> Table:
    """`audit show`'s table: a row per record shown, the caption how many of how many."""
    table = Table(
        "seq",
        "time",
        "event",
        "decision",
        "method",
        "host",
        "status",
        "action",
        "rule / reason",
        caption=f"{len(shown)} of {seen} records",
    )
    for record in shown:
        decision_text = record.get("decision")
        status = record.get("status")
        table.add_row(
            common.cell(record.get("seq")),
            common.when(record.get("time")),
            common.cell(record.get("event")),
            Text(str(decision_text or "-"), style=DECISION_STYLE.get(str(decision_text), "")),
            common.cell(record.get("method")),
            common.cell(record.get("host")),
            common.cell(status if record.get("event") in ("request", "block") else None),
            common.cell(acted(record)),
            common.cell(detail(record)),
        )
    return table
