"""The gateway's anchors of each session's audit chain, kept where the proxy cannot write.

The proxy is the only writer of its audit log, and its state directory is bind-mounted into the
proxy's container: a proxy (or anyone with the proxy's uid on the host) could cut the log short
or rewrite it whole with fresh hashes, and the chain alone would still verify. So the gateway asks
the proxy for its chain head ``(seq, hash)`` as it watches it and at the session's end, and
appends each answer here, one line per anchor, keyed with HMAC-SHA256 (:mod:`corral.proxy.audit`)
under a secret only the gateway reads:

- ``<data_dir>/audit-anchors/key``: 32 random bytes, 0600, made on first use;
- ``<data_dir>/audit-anchors/<session>.jsonl``: the anchors, 0600, in a 0700 directory that is
  never mounted into any container.

Anchors that set a policy (``start``, ``policy``, ``reassert``, ``adopted``) also hold it
(``set``: generation, allow, mode): that is the policy the gateway expects the proxy to run, which
a restarted gateway reads back from here.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Unpack

from corral.gateway.store import session_dir
from corral.proxy.audit import Anchor, AnchoredPolicy, AnchorFields, make_anchor, parse_anchors

log = logging.getLogger(__name__)

ANCHORS_DIR = "audit-anchors"
KEY_FILE = "key"
KEY_BYTES = 32


class AnchorBook:
    """Appends and reads the anchors of every session of one gateway (thread-safe: teardown runs in
    a worker thread)."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / ANCHORS_DIR
        self._key: bytes | None = None
        self._lock = threading.Lock()
        self._heads: dict[str, tuple[int, str]] = {}  # the last head anchored, per session

    @property
    def key_path(self) -> Path:
        return self.root / KEY_FILE

    def key(self) -> bytes:
        """The gateway's anchor key, made on first use (0600, in a 0700 directory)."""
        with self._lock:
            if self._key is None:
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(self.root, 0o700)
                try:
                    # O_EXCL: two gateways on one data dir never end up with two keys.
                    fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    self._key = self.key_path.read_bytes()
                else:
                    key = secrets.token_bytes(KEY_BYTES)
                    with os.fdopen(fd, "wb") as out:
                        out.write(key)
                    self._key = key
                if len(self._key) < KEY_BYTES:
                    raise ValueError(f"{self.key_path} holds no anchor key")
            return self._key

    def path(self, session_id: str) -> Path:
        """The session's anchors file; ValueError for anything but a session id."""
        return session_dir(self.root, session_id).with_suffix(".jsonl")

    def append(self, session_id: str, seq: int, chain_hash: str, reason: str, **fields: Unpack[AnchorFields]) -> Anchor:
        """One anchor, written with one ``write`` of a whole line."""
        key = self.key()
        anchor = make_anchor(key, session_id, seq, chain_hash, reason, **fields)
        line = json.dumps(anchor, sort_keys=True, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            fd = os.open(self.path(session_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            self._heads[session_id] = (seq, chain_hash)
        return anchor

    def read(self, session_id: str) -> list[Anchor]:
        """The session's anchors, each MAC checked (ValueError names a bad one); none: []."""
        try:
            lines = self.path(session_id).read_bytes().splitlines()
        except FileNotFoundError:
            return []
        return parse_anchors(lines, self.key())

    def text(self, session_id: str) -> bytes:
        """The anchors file as stored, once every line's MAC is checked (for download)."""
        self.read(session_id)
        try:
            return self.path(session_id).read_bytes()
        except FileNotFoundError:
            return b""

    def last_head(self, session_id: str) -> tuple[int, str] | None:
        """The head last anchored for the session (read back from the file after a restart)."""
        with self._lock:
            cached = self._heads.get(session_id)
        if cached is not None:
            return cached
        anchors = self._read_quietly(session_id)
        if not anchors:
            return None
        head = max((int(a["seq"]), str(a["hash"])) for a in anchors)
        with self._lock:
            self._heads.setdefault(session_id, head)
        return head

    def expected_policy(self, session_id: str) -> AnchoredPolicy | None:
        """The policy the gateway last set on the session's proxy: ``{"generation", "allow", "mode"}``."""
        for anchor in reversed(self._read_quietly(session_id)):
            policy = anchor.get("set")
            if isinstance(policy, dict):
                return policy
        return None

    def _read_quietly(self, session_id: str) -> list[Anchor]:
        try:
            return self.read(session_id)
        except ValueError as exc:
            log.error("the audit anchors of %s are damaged: %s", session_id, exc)
            return []

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._heads.pop(session_id, None)

    def remove(self, session_id: str) -> None:
        """With the session's audit log, at retention."""
        self.forget(session_id)
        self.path(session_id).unlink(missing_ok=True)
