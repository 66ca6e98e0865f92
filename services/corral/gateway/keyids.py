"""Records an older gateway wrote under its key ids, renamed to this gateway's at start.

An older gateway named an API key ``key-`` + 12 hex digits of an unsalted SHA-256 of the key
(corral.gateway.auth.legacy_key_id); this one names it by an HMAC under its own secret. So that a
key still opens what it owned after an upgrade (its live and ended sessions, audit logs,
recordings, uploaded replay responses) and its per-key caps count what it had, every record of
the data dir that names an owner is rewritten once, at start, before any is read: the session
records (``owner``, and each viewer link's ``created_by``), the audit archive's ``session.json``,
each recording's ``.owner`` and each replay upload's ``.owner``. Only ids of keys this gateway
holds are renamed (``renamed``: old id -> new); the rest are left as they are (a key no longer
given opens nothing, as before). Running it again changes nothing.

What it cannot change: audit records already written (a hash chain; their ``actor`` may name the
old id) and bundles already downloaded. docs/gateway.md says so; rotating the key is the remedy.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.gateway.store import write_json, write_private

log = logging.getLogger(__name__)

OWNER_NOTE = ".owner"  # corral.gateway.recording.OWNER_FILE, corral.gateway.replays.OWNER_SUFFIX


def _renamed_record(record: Any, renamed: Mapping[str, str]) -> bool:
    """Rename in place what a session record says of its owner; whether anything changed."""
    if not isinstance(record, dict):
        return False
    changed = False
    if record.get("owner") in renamed:
        record["owner"], changed = renamed[record["owner"]], True
    links = record.get("links")
    for link in links.values() if isinstance(links, dict) else ():
        if isinstance(link, dict) and link.get("created_by") in renamed:
            link["created_by"], changed = renamed[link["created_by"]], True
    return changed


def _json_files(paths: list[Path], renamed: Mapping[str, str]) -> int:
    count = 0
    for path in paths:
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            if _renamed_record(record, renamed):
                write_json(path, record)
                count += 1
    return count


def _owner_notes(paths: list[Path], renamed: Mapping[str, str]) -> int:
    count = 0
    for path in paths:
        with contextlib.suppress(OSError, ValueError):
            owner = path.read_text().strip()
            if owner in renamed:
                write_private(path, renamed[owner])
                count += 1
    return count


def adopt(data_dir: Path, renamed: Mapping[str, str]) -> int:
    """Rename the owners of ``data_dir``'s records (old id -> new, ``renamed``); how many files changed."""
    if not renamed or not data_dir.is_dir():
        return 0
    count = _json_files(sorted((data_dir / "sessions").glob("*.json")), renamed)
    count += _json_files(sorted((data_dir / "egress").glob("ses_*/session.json")), renamed)
    count += _owner_notes(sorted((data_dir / "recordings").glob(f"ses_*/{OWNER_NOTE}")), renamed)
    count += _owner_notes(sorted((data_dir / "replay-responses").glob(f"*{OWNER_NOTE}")), renamed)
    if count:
        log.info("%d record(s) written by an older gateway now name their key by its new id", count)
    return count
