"""Session records in the gateway's data directory: one JSON file each, written atomically.

Docker says which sandboxes live; these files say which session each one serves (a claimed
pool container cannot be relabelled), so a restarted gateway finds its sessions again.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def session_dir(root: Path, session_id: str) -> Path:
    """``root/<session_id>`` for a well-formed session id only (no path tricks); else ValueError."""
    if not session_id.startswith("ses_") or not session_id[4:].isascii() or not session_id[4:].isalnum():
        raise ValueError(f"not a session id: {session_id!r}")
    return root / session_id


class SessionStore:
    def __init__(self, data_dir: Path) -> None:
        self._dir = data_dir / "sessions"
        self._dir.mkdir(parents=True, exist_ok=True)

    def save(self, session_id: str, record: dict[str, Any]) -> None:
        path = self._dir / f"{session_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)

    def delete(self, session_id: str) -> None:
        (self._dir / f"{session_id}.json").unlink(missing_ok=True)

    def load_all(self) -> list[dict[str, Any]]:
        records = []
        for path in sorted(self._dir.glob("*.json")):
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                log.warning("unreadable session record %s; ignoring it", path.name)
        return records
