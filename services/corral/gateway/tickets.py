"""Signed CDP connect tickets: a short-lived, single-session address for clients that cannot set an
``Authorization`` header on their WebSocket (``POST /v1/sessions/{id}/cdp/connect``, docs/cdp.md).

A ticket is ``<payload>.<mac>``, both base64url: the payload is the session id, the expiry (unix
seconds) and whether the connection is exclusive; the MAC is HMAC-SHA256 of it under a key the
gateway keeps in its data dir (``cdp-ticket-key``, 32 random bytes, 0600, made on first use), so
tickets stay good across a restart of the gateway and nothing about them is stored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.errors import Forbidden, TicketKeyUnusable, Unauthorized
from corral.gateway.store import read_or_make_secret

KEY_FILE = "cdp-ticket-key"
KEY_BYTES = 32
MAX_TTL_S = 600
_MAX_TICKET = 512


@dataclass(frozen=True, slots=True)
class Ticket:
    session_id: str
    expires_at: int
    exclusive: bool


def _read_or_make(path: Path) -> bytes:
    try:
        return read_or_make_secret(path, KEY_BYTES)
    except OSError as exc:
        raise TicketKeyUnusable(f"{path}: {exc.strerror}") from None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TicketSigner:
    """Issues and checks tickets; ``key`` is read (or made) on first use. ``clock``: unix seconds."""

    def __init__(self, data_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self._path = data_dir / KEY_FILE
        self._clock = clock
        self._key: bytes | None = None
        self._lock = threading.Lock()

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self.key(), payload, hashlib.sha256).digest()

    def key(self) -> bytes:
        """The key, read or made once; :class:`TicketKeyUnusable` each time it cannot be."""
        with self._lock:
            if self._key is None:
                key = _read_or_make(self._path)
                if len(key) != KEY_BYTES:  # checked before it is kept: never a short key, not even once
                    raise TicketKeyUnusable(f"{self._path} holds {len(key)} bytes, not a {KEY_BYTES}-byte key")
                self._key = key
            return self._key

    def issue(self, session_id: str, ttl_s: int, exclusive: bool) -> tuple[str, Ticket]:
        """A ticket for ``session_id`` good for ``ttl_s`` seconds (at most :data:`MAX_TTL_S`)."""
        ticket = Ticket(session_id, int(self._clock()) + min(ttl_s, MAX_TTL_S), exclusive)
        payload = f"{ticket.session_id}\n{ticket.expires_at}\n{int(ticket.exclusive)}".encode()
        return f"{_b64(payload)}.{_b64(self._mac(payload))}", ticket

    def check(self, text: str, session_id: str) -> Ticket:
        """The ticket ``text`` for the session in the path: :class:`Unauthorized` when it is no
        ticket of this gateway's or has expired, :class:`Forbidden` when it is another session's."""
        payload_b64, _, mac_b64 = text.partition(".")
        try:
            if len(text) > _MAX_TICKET:
                raise ValueError("too long")
            payload, mac = _unb64(payload_b64), _unb64(mac_b64)
            if not hmac.compare_digest(mac, self._mac(payload)):
                raise ValueError("bad MAC")
            ticket_session, expires, exclusive = payload.decode().split("\n")
            ticket = Ticket(ticket_session, int(expires), exclusive == "1")
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise Unauthorized("that CDP connect ticket is not valid") from None
        if ticket.expires_at <= self._clock():
            raise Unauthorized("that CDP connect ticket has expired")
        if ticket.session_id != session_id:
            raise Forbidden("that CDP connect ticket is for another session")
        return ticket


__all__ = ["KEY_BYTES", "KEY_FILE", "MAX_TTL_S", "Ticket", "TicketSigner"]
