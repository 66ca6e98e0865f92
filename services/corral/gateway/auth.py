"""API keys and session tokens: constant-time checks, only hashes kept, never logged.

An API key is named by its id, ``key-`` and 24 hex digits of HMAC-SHA256 of the key under the
gateway's own secret (``key-id-key`` in the data dir, 32 random bytes, 0600, made on first start):
stable across restarts (per-key caps and ownership keep matching), and no one without that file can
compute it from a guess of the key. An older gateway named a key by an unsalted SHA-256 prefix
(:func:`legacy_key_id`); :attr:`KeyRing.renamed` maps those to the new ids for the records written
before (corral.gateway.keyids). What the sandbox side reads (audit records, the lease, the
recording) never holds a key id at all: the session's owner is ``owner`` there (:data:`OWNER`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corral.contracts import actors
from corral.errors import Forbidden, KeyIdKeyUnusable, NotFound, SessionNotFound, Unauthorized
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import read_or_make_secret

KEY_FILE = "api_key"
KEY_ID_KEY_FILE = "key-id-key"
KEY_ID_KEY_BYTES = 32
# How a session's records name its owner's key wherever the session's own side reads them (audit
# records' actor, the lease's holder, recording events): only the owner's key acts on a session, so
# the word says who without naming which key (two sessions of one key are not linkable by it).
OWNER = "owner"
OWNER_ACTOR = f"api-key:{OWNER}"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_id(key: str, secret: bytes) -> str:
    """A stable name for an API key (per-key caps, ownership): HMAC-SHA256 under the gateway's
    ``secret``, so it says nothing of the key to anyone without that secret."""
    return "key-" + hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:24]


def legacy_key_id(key: str) -> str:
    """The id an older gateway gave a key (an unsalted SHA-256 prefix: a guessable key was found
    from it offline); only to recognise records written then (:attr:`KeyRing.renamed`)."""
    return "key-" + digest(key)[:12]


def load_key_id_key(data_dir: Path) -> bytes:
    """The gateway's secret for key ids, read or made once (0600); :class:`KeyIdKeyUnusable` when
    it cannot be read or is not a key."""
    path = data_dir / KEY_ID_KEY_FILE
    try:
        secret = read_or_make_secret(path, KEY_ID_KEY_BYTES)
    except OSError as exc:
        raise KeyIdKeyUnusable(f"{path}: {exc.strerror}") from None
    if len(secret) != KEY_ID_KEY_BYTES:
        raise KeyIdKeyUnusable(f"{path} holds {len(secret)} bytes, not a {KEY_ID_KEY_BYTES}-byte key")
    return secret


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


LinkMode = Literal["view", "control"]
LINK_ONLY = "a viewer link opens only its session's viewer and live stream"


@dataclass(frozen=True, slots=True)
class LinkGrant:
    """What a good viewer link (corral.gateway.links) opens: its session's viewer reads and live
    stream, in its mode."""

    session_id: str
    link_id: str
    mode: LinkMode

    @property
    def actor(self) -> str:
        """Who acts through it, as the lease, the recording and the audit name them."""
        return actors.human(self.link_id)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request, and what that lets them do.

    An API key (``key_id``) makes sessions, and opens every session it owns: live, and once ended
    its audit log and recording; it alone changes a session's egress and makes its viewer links. A
    session token (``session_id``) opens that one session while it lives, and nothing else. A viewer
    link (``link``) opens what the viewer page reads of its live session (recording events and
    frames, traffic) and its live stream, nothing else (403); one revoked or expired
    (``link_refused`` says which) opens nothing (401). A caller with none of these sent no
    credential (``presented`` false) or one that is none. Pure: each check raises the refusal
    (corral.errors) the gateway answers with.
    """

    key_id: str | None = None
    session_id: str | None = None
    presented: bool = False
    link: LinkGrant | None = None  # a link's, good or not
    link_refused: str | None = None  # "link revoked" / "link expired": the link opens nothing

    def api_key(self) -> str:
        """The API key's id, for what only a key may do (a session token is no key: 401)."""
        if not self.presented:
            raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
        self._not_a_link()
        if self.key_id is None:
            raise Unauthorized("that API key is not valid")
        return self.key_id

    def known(self) -> None:
        """An API key or a live session's token, whichever: 401 for anything else (403 for a link)."""
        if not self.presented:
            raise Unauthorized("send an API key or the session token as 'Authorization: Bearer ...'")
        self._not_a_link()
        if self.key_id is None and self.session_id is None:
            raise Unauthorized("that API key or token is not valid")

    def _not_a_link(self) -> None:
        if self.link_refused is not None:
            raise Unauthorized(self.link_refused)
        if self.link is not None:
            raise Forbidden(LINK_ONLY)

    def open_view(self, session_id: str, owner: str | None) -> None:
        """What the viewer page reads of the live session ``session_id`` (recording events and
        frames, traffic) and its live stream: what :meth:`open_live` opens, or a link of this session."""
        if self.link_refused is not None:
            raise Unauthorized(self.link_refused)
        if self.link is None:
            self.open_live(session_id, owner)
            return
        if self.link.session_id != session_id:
            raise Forbidden("this viewer link is for another session")
        if owner is None:
            raise SessionNotFound(f"no session {session_id}")

    def live_viewer(self, session_id: str, owner: str | None) -> tuple[str, LinkMode]:
        """Who watches the live stream of ``session_id``, and how: a link as its mode says
        (``human:<link id>``), the owner's key in control (``human:owner``: never its id, which the
        lease and the recording would show the agent), the session's own token as the agent, watching."""
        self.open_view(session_id, owner)
        if self.link is not None:
            return self.link.actor, self.link.mode
        if self.key_id is not None:
            return actors.human(OWNER), "control"
        return actors.AGENT, "view"

    def grant_links(self) -> str:
        """The owner's key id, for making or revoking viewer links (after :meth:`open_live`): the
        agent's token must not grant itself a human's powers."""
        if self.key_id is None:
            raise Forbidden("viewer links are made and revoked with the session owner's API key, not its token")
        return self.key_id

    def grant_previews(self) -> str:
        """The owner's key id, for making, listing or revoking port previews (after :meth:`open_live`):
        the agent's token must not hand out its sandbox's servers to the world."""
        if self.key_id is None:
            raise Forbidden(
                "port previews are made, listed and revoked with the session owner's API key, not its token"
            )
        return self.key_id

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

    def change_session(self) -> None:
        """A session token is what the agent holds: it must not change its own session (widen its
        egress, extend or shorten its life: docs/design/0341-lifetime-owner-only.md)."""
        if self.key_id is None:
            raise Forbidden("changing a session (its egress, secrets or timeout) needs its owner's API key")

    def change_egress(self) -> None:
        """A session token is what the agent holds: it must not widen its own egress."""
        if self.key_id is None:
            raise Forbidden("changing a session's egress needs its owner's API key")


class KeyRing:
    def __init__(self, keys: list[str], secret: bytes) -> None:
        self._digests = {digest(key): key_id(key, secret) for key in keys}
        # Each key's id as an older gateway wrote it -> its id now (records written before an upgrade).
        self.renamed = {legacy_key_id(key): key_id(key, secret) for key in keys}

    @classmethod
    def for_gateway(cls, settings: GatewaySettings) -> KeyRing:
        """The keys of ``CORRAL_API_KEY`` (refused when too weak: :class:`WeakApiKey`), or else the
        one generated on first start and kept; ids under the data dir's key-id secret."""
        keys = settings.api_keys() or [load_or_create_key(settings.data_dir)]
        return cls(keys, load_key_id_key(settings.data_dir))

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
