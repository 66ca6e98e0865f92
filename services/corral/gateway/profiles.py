"""Saved browser profiles (Chromium's cookies, local storage and IndexedDB) per API key, in the data dir
and encrypted at rest.

A profile is the archive a sandbox made of its browser's state (corral.sandbox.web.statearchive): bytes
the gateway never unpacks (only a sandbox does), stored as ``profiles/<key id>/<name>.profile``: a
format line, a random 96-bit nonce and the AES-256-GCM ciphertext under the operator's
``CORRAL_PROFILE_KEY`` (through HKDF), with the key id and the profile's name as associated data: a
file copied to another key's or another name's place does not decrypt. Written whole and renamed
into place (the previous version stays until the new one is complete); capped in size before a byte
is written. Without a profile key there are no saved profiles (:class:`ProfilesOff`)."""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from corral.errors import ProfileNotFound, ProfilesOff, ProfileTooLarge, ProfileUnreadable
from corral.gateway.store import DIR_MODE, private_file

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_KEY_ID = re.compile(r"^key-[0-9a-f]{8,64}$")
MAGIC = b"corral-profile-v1\n"
_NONCE_BYTES = 12
_SUFFIX = ".profile"


@dataclass(frozen=True, slots=True)
class ProfileInfo:
    """What a profile's owner sees of it: never its contents."""

    name: str
    size: int  # the archive's bytes (before encryption)
    saved_at: float


def derive_key(material: str) -> bytes:
    """The AES-256 key from the operator's secret (any strong string: HKDF-SHA256, a fixed context)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"corral profiles v1").derive(material.encode())


def associated(owner: str, name: str) -> bytes:
    return b"\0".join((MAGIC.strip(), owner.encode(), name.encode()))


def seal(key: bytes, owner: str, name: str, plain: bytes) -> bytes:
    nonce = secrets.token_bytes(_NONCE_BYTES)
    return MAGIC + nonce + AESGCM(key).encrypt(nonce, plain, associated(owner, name))


def unseal(key: bytes, owner: str, name: str, sealed: bytes) -> bytes:
    """The archive; :class:`ProfileUnreadable` for a file of another key, name or profile key, or damaged."""
    body = sealed.removeprefix(MAGIC)
    if body is sealed or len(body) < _NONCE_BYTES + 16:
        raise ProfileUnreadable(f"saved profile {name!r} is not in a format this gateway reads")
    try:
        return AESGCM(key).decrypt(body[:_NONCE_BYTES], body[_NONCE_BYTES:], associated(owner, name))
    except InvalidTag:
        raise ProfileUnreadable(
            f"saved profile {name!r} does not decrypt: saved under another CORRAL_PROFILE_KEY, or damaged"
        ) from None


STATE_MAGIC = b"corral-browser-state-v1\n"
_LENGTH = 8


def pack_state(archive: bytes, cookies: bytes) -> bytes:
    """A browser's state as one value: the cookies CDP read (JSON) and the files' archive. Pure."""
    return STATE_MAGIC + len(cookies).to_bytes(_LENGTH, "big") + cookies + archive


def unpack_state(state: bytes) -> tuple[bytes, bytes]:
    """(archive, cookies) of :func:`pack_state`'s value; :class:`ProfileUnreadable` for anything else. Pure."""
    body = state.removeprefix(STATE_MAGIC)
    if body is state or len(body) < _LENGTH:
        raise ProfileUnreadable("a saved profile in a format this gateway does not read")
    size = int.from_bytes(body[:_LENGTH], "big")
    if size > len(body) - _LENGTH:
        raise ProfileUnreadable("a saved profile cut short")
    return body[_LENGTH + size :], body[_LENGTH : _LENGTH + size]


def check_name(name: str) -> str:
    if NAME.fullmatch(name) is None:
        raise ProfileNotFound(f"no profile {name!r} (a name is 1-64 of letters, digits, '.', '_', '-')")
    return name


class ProfileStore:
    """The saved profiles of every key; ``key`` None: profiles are off (every use says so)."""

    def __init__(self, root: Path, key: bytes | None, max_bytes: int) -> None:
        self._root, self._key, self.max_bytes = root, key, max_bytes

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def require(self) -> bytes:
        if self._key is None:
            raise ProfilesOff(
                "browser profiles are off on this gateway: its operator sets CORRAL_PROFILE_KEY_FILE "
                "(or CORRAL_PROFILE_KEY) to a secret of 32 or more characters"
            )
        return self._key

    def _dir(self, owner: str) -> Path:
        if _KEY_ID.fullmatch(owner) is None:
            raise ValueError(f"not a key id: {owner!r}")
        return self._root / owner

    def _path(self, owner: str, name: str) -> Path:
        return self._dir(owner) / f"{check_name(name)}{_SUFFIX}"

    def exists(self, owner: str, name: str) -> bool:
        return self._path(owner, name).is_file()

    def load(self, owner: str, name: str) -> bytes:
        """The archive saved as ``name`` by ``owner``; 404 naming it when there is none (another key's
        is none too)."""
        key = self.require()
        path = self._path(owner, name)
        try:
            sealed = path.read_bytes()
        except FileNotFoundError:
            raise ProfileNotFound(f"no profile {name!r}") from None
        return unseal(key, owner, name, sealed)

    def save(self, owner: str, name: str, plain: bytes) -> ProfileInfo:
        """Encrypted and renamed over the previous version; over the cap: :class:`ProfileTooLarge` and
        the previous version untouched."""
        key = self.require()
        if len(plain) > self.max_bytes:
            raise ProfileTooLarge(
                f"profile {name!r} would be {len(plain)} bytes, over the cap of {self.max_bytes} "
                "(CORRAL_PROFILE_MAX_MB); the saved version is unchanged"
            )
        path = self._path(owner, name)
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        with private_file(path, None) as out:
            out.write(seal(key, owner, name, plain))
        return ProfileInfo(name, len(plain), time.time())

    def info(self, owner: str, name: str) -> ProfileInfo:
        path = self._path(owner, name)
        try:
            stat = path.stat()
        except FileNotFoundError:
            raise ProfileNotFound(f"no profile {name!r}") from None
        return _info(name, stat)

    def list(self, owner: str) -> list[ProfileInfo]:
        folder = self._dir(owner)
        if not folder.is_dir():
            return []
        found = []
        for entry in sorted(folder.iterdir()):
            name = entry.name.removesuffix(_SUFFIX)
            if entry.name.endswith(_SUFFIX) and NAME.fullmatch(name) and entry.is_file():
                found.append(_info(name, entry.stat()))
        return found

    def delete(self, owner: str, name: str) -> None:
        try:
            self._path(owner, name).unlink()
        except FileNotFoundError:
            raise ProfileNotFound(f"no profile {name!r}") from None


def _info(name: str, stat: os.stat_result) -> ProfileInfo:
    overhead = len(MAGIC) + _NONCE_BYTES + 16
    return ProfileInfo(name, max(stat.st_size - overhead, 0), stat.st_mtime)
