"""The audit log: JSON Lines, one record per event, each carrying the SHA-256 of the one before.

``prev`` of the first record is 64 zeros; ``hash`` is the SHA-256 of the record's canonical JSON
(sorted keys, no spaces) without ``hash``. Changing, removing, inserting or reordering a record
breaks the chain at that record, and :func:`verify` names it. Each record is written with one
``write`` and flushed, so a proxy killed mid-session loses nothing it already logged.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
REDACTED = "[redacted]"
_SECRET_HEADER = re.compile(r"token|secret|passw|api-?key|auth|cookie|session|csrf|xsrf|signature|credential", re.I)
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-amz-security-token",
        "x-goog-api-key",
    }
)
# Long words anywhere in a name (accessToken, apikey, sessionid); short ones only as a whole part.
_SECRET_QUERY = re.compile(
    r"token|secret|passw|apikey|api_key|api-key|auth|credential|session|signature"
    r"|(^|_|-|\.)(key|pwd|sig|code|jwt|sid)s?($|_|-|\.)",
    re.I,
)


@functools.lru_cache(maxsize=1024)
def _secret_header(name: str) -> bool:
    # Cached: a proxy sees the same few dozen header names over and over.
    return name.lower() in SECRET_HEADERS or _SECRET_HEADER.search(name) is not None


def is_secret_header(name: str) -> bool:
    """Whether a header carries a credential (the audit log redacts it; recorded responses blank it)."""
    return _secret_header(name)


def redact_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(name, REDACTED if _secret_header(name) else value) for name, value in headers]


def redact_url(url: str) -> str:
    """The URL with the values of secret-looking query parameters (and any user info) replaced."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    if not parts.query:
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    query = urllib.parse.urlencode([(k, REDACTED if _SECRET_QUERY.search(k) else v) for k, v in pairs], safe="[]")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def _digest(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class AuditLog:
    """Appends records for one session; reopening a log continues its chain."""

    def __init__(self, path: Path, session: str) -> None:
        self.path = path
        self.session = session
        self._seq = 0
        self._prev = GENESIS
        damaged = 0
        ends_cleanly = True
        if path.exists():
            with path.open("rb") as existing:
                for line in existing:
                    ends_cleanly = line.endswith(b"\n")
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                        self._seq, self._prev = int(record["seq"]), str(record["hash"])
                    except (ValueError, KeyError, TypeError):
                        damaged += 1  # kept in place: verify will name it
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        if not ends_cleanly:
            os.write(self._fd, b"\n")  # a torn last line must not swallow the next record
        if damaged:
            # Continue the chain from the last good record, and say so in it.
            self.write("recovered", damaged_lines=damaged)

    @property
    def seq(self) -> int:
        """The sequence number of the last record written."""
        return self._seq

    @property
    def head(self) -> dict[str, Any]:
        """The chain's head: ``seq`` and ``hash`` of the last record written (what the gateway anchors)."""
        return {"seq": self._seq, "hash": self._prev}

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        record: dict[str, Any] = {
            "seq": self._seq,
            "time": time.time(),
            "session": self.session,
            "event": event,
            **fields,
            "prev": self._prev,
        }
        # The canonical text is made once: hashed, then written with the hash appended (readers
        # re-canonicalise to verify, so where "hash" sits in the line does not matter).
        text = json.dumps(record, sort_keys=True, separators=(",", ":"))
        record["hash"] = digest = hashlib.sha256(text.encode()).hexdigest()
        # One write of a whole line: a reader never sees half a record, a kill loses none already written.
        os.write(self._fd, f'{text[:-1]},"hash":"{digest}"}}\n'.encode())
        self._prev = digest
        return record

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True, slots=True)
class Verification:
    ok: bool
    records: int
    first_bad: int | None = None  # line number, from 1
    reason: str = ""


def verify(path: Path) -> Verification:
    """Check the whole chain; names the first record that was changed, removed, inserted or moved."""
    prev = GENESIS
    count = 0
    with path.open("rb") as log:
        for number, line in enumerate(log, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                return Verification(False, count, number, "not valid JSON")
            if not isinstance(record, dict) or "hash" not in record or "prev" not in record:
                return Verification(False, count, number, "not an audit record")
            if record["prev"] != prev:
                return Verification(False, count, number, "does not follow the record before it")
            if record["hash"] != _digest(record):
                return Verification(False, count, number, "its content was changed")
            if record.get("seq") != count + 1:
                return Verification(
                    False, count, number, f"sequence number {record.get('seq')} where {count + 1} was due"
                )
            prev = record["hash"]
            count += 1
    return Verification(True, count)
