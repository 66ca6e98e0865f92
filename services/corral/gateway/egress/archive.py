"""The egress archive: each session's metadata beside its audit log (``session.json``), the logs a key
may read, and retention. Logs outlive sessions; a pair that never served a session goes after the
retention too."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import TypedDict

from corral.gateway.store import write_json
from corral.proxy.control import AUDIT_FILE

from .ledger import PolicyLedger
from .pairs import META_FILE
from .state import EgressState

# session.json: the session, its owner, when it was made and ended and why (corral.gateway.keyids
# renames owners in place); an open record, as each stop adds what it knows.
SessionMeta = dict[str, object]


class AuditLogEntry(TypedDict):
    """One audit log as ``GET /v1/audit`` lists it."""

    session: str
    state: str  # "live" or "ended"
    created_at: float | None
    ended_at: float | None
    records: int
    bytes: int


class EgressArchive:
    """Each session's metadata and audit log, listed per key and pruned after the retention."""

    def __init__(self, state: EgressState, ledger: PolicyLedger) -> None:
        self._state = state
        self._root = state.root
        self._ledger = ledger

    def write_meta(self, session_id: str, **fields: object) -> None:
        path = self._state.state_dir(session_id) / META_FILE
        meta = json.loads(path.read_text()) if path.exists() else {"session": session_id}
        meta.update(fields)
        write_json(path, meta)

    def meta(self, session_id: str) -> SessionMeta | None:
        try:
            loaded = json.loads((self._state.state_dir(session_id) / META_FILE).read_text())
        except (ValueError, OSError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def logs(self, owner: str) -> list[AuditLogEntry]:
        """The audit logs this API key may read, live or ended, newest first."""
        out = []
        for meta_path in self._root.glob(f"ses_*/{META_FILE}"):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            if meta.get("owner") != owner:
                continue
            size, count = size_and_lines(meta_path.parent / AUDIT_FILE)
            out.append(
                AuditLogEntry(
                    session=meta["session"],
                    state="ended" if meta.get("ended_at") else "live",
                    created_at=meta.get("created_at"),
                    ended_at=meta.get("ended_at"),
                    records=count,
                    bytes=size,
                )
            )
        return sorted(out, key=lambda item: item.get("created_at") or 0, reverse=True)

    def prune(self, retention_s: float, live: set[str]) -> int:
        """Remove ended sessions' egress state older than the retention; returns how many."""
        removed = 0
        cutoff = time.time() - retention_s
        for state in self._root.glob("ses_*"):
            # Pool pairs that never served a session have no metadata: nobody's log, gone after retention.
            if not (state / META_FILE).exists() and state.name not in live and state.stat().st_mtime < cutoff:
                shutil.rmtree(state, ignore_errors=True)
                self._ledger.remove(state.name)
                removed += 1
        for meta_path in self._root.glob(f"ses_*/{META_FILE}"):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            ended = meta.get("ended_at")
            if ended and ended < cutoff and meta.get("session") not in live:
                shutil.rmtree(meta_path.parent, ignore_errors=True)
                self._ledger.remove(meta_path.parent.name)
                removed += 1
        return removed


def size_and_lines(path: Path, chunk: int = 1 << 20) -> tuple[int, int]:
    """A log's bytes and records (its non-blank lines), read a chunk at a time: however long a line
    (a proxy could write one without end), the gateway holds one chunk."""
    try:
        log_file = path.open("rb")
    except FileNotFoundError:
        return 0, 0
    lines, open_line = 0, False  # open_line: the line being read has something on it
    with log_file:
        size = os.fstat(log_file.fileno()).st_size
        while data := log_file.read(min(chunk, size - log_file.tell())):
            *ended, rest = data.split(b"\n")
            for segment in ended:
                lines += 1 if open_line or segment.strip() else 0
                open_line = False
            open_line = open_line or bool(rest.strip())
    return size, lines + (1 if open_line else 0)
