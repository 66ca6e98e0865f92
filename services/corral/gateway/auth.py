"""API keys and session tokens: constant-time checks, only hashes kept, never logged."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from corral.errors import Forbidden, NotFound, SessionNotFound, Unauthorized
from corral.gateway.settings import GatewaySettings

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
class Caller:
    """Who made a request, and what that lets them do.

    An API key (``key_id``) makes sessions, and opens every session it owns: live, and once ended
    its audit log and recording; it alone changes a session's egress. A session token
    (``session_id``) opens that one session while it lives, and nothing else. A caller with neither
    sent no credential (``presented`` false) or one that is neither. Pure: each check raises the
    refusal (corral.errors) the gateway answers with.
    """

    key_id: str | None = None
    session_id: str | None = None
    presented: bool = False

    def api_key(self) -> str:
        """The API key's id, for what only a key may do (a session token is no key: 401)."""
        if not self.presented:
            raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
        if self.key_id is None:
            raise Unauthorized("that API key is not valid")
        return self.key_id

    def known(self) -> None:
        """An API key or a live session's token, whichever: 401 for anything else."""
        if not self.presented:
            raise Unauthorized("send an API key or the session token as 'Authorization: Bearer ...'")
        if self.key_id is None and self.session_id is None:
            raise Unauthorized("that API key or token is not valid")

    def open_live(self, session_id: str, owner: str | None) -> None:
        """The live session ``session_id`` (``owner`` None: there is none): its owner's key or its own token."""
        self.known()
        if owner is None:
            raise SessionNotFound(f"no session {session_id}")
        if self.key_id is not None:
            if self.key_id != owner:
                raise Forbidden("this session belongs to another API key")
        elif self.session_id != session_id:
            raise Forbidden("a session token only opens its own session")

    def open_kept(self, owner: str | None, missing: str) -> None:
        """What a session leaves behind, live or ended (audit log, recording), for an API key: its
        owner's only. ``owner`` None: nothing kept (``missing`` says what)."""
        key = self.api_key()
        if owner is None:
            raise NotFound(missing)
        if owner != key:
            raise Forbidden("this session belongs to another API key")

    def change_egress(self) -> None:
        """A session token is what the agent holds: it must not widen its own egress."""
        if self.key_id is None:
            raise Forbidden("changing a session's egress needs its owner's API key")


class KeyRing:
    def __init__(self, keys: list[str]) -> None:
        self._digests = {digest(key): key_id(key) for key in keys}

    @classmethod
    def for_gateway(cls, settings: GatewaySettings) -> KeyRing:
        """The keys of ``CORRAL_API_KEY``, or else the one generated on first start and kept."""
        return cls(settings.api_keys() or [load_or_create_key(settings.data_dir)])

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
