"""API keys and session tokens: constant-time checks, only hashes kept, never logged."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

KEY_FILE = "api_key"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_id(key: str) -> str:
    """A stable, non-secret name for an API key (per-key caps, ownership)."""
    return "key-" + digest(key)[:12]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def load_or_create_key(data_dir: Path) -> str:
    """The generated key in ``data_dir``, made on first start (readable by its owner only)."""
    path = data_dir / KEY_FILE
    if path.is_file():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    key = "crl_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: an API key (any session it owns) or one session's token."""

    key_id: str | None = None
    session_id: str | None = None


class KeyRing:
    def __init__(self, keys: list[str]) -> None:
        self._digests = {digest(key): key_id(key) for key in keys}

    def check(self, presented: str) -> str | None:
        """The key's id when ``presented`` is one of the keys, compared in constant time."""
        candidate = digest(presented)
        found = None
        for known, ident in self._digests.items():
            if hmac.compare_digest(candidate, known):
                found = ident
        return found


def token_matches(presented: str, token_sha256: str) -> bool:
    return hmac.compare_digest(digest(presented), token_sha256)
