"""Session records in the gateway's data directory: one JSON file each, written atomically.

Docker says which sandboxes live; these files say which session each one serves (a claimed
pool container cannot be relabelled), so a restarted gateway finds its sessions again.

Everything the gateway keeps is its own business: the data directory is 0700 and every file in it
is created 0600 (:func:`private_dir`, :func:`write_private`), so no other host user reads a
session's record, frames or uploads, whatever the process umask.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """``path`` (and missing parents) as a directory only its owner can enter.

    Made 0700 at creation; one that exists with a wider mode (an older gateway's) is narrowed.
    """
    missing = []
    parent = path
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):  # mkdir(parents=True) would make the parents with the umask's mode
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=DIR_MODE)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, mode & DIR_MODE)
    return path


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """A file descriptor for ``path``, created 0600 (an existing file keeps its mode)."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def write_private(path: Path, data: bytes | str, owner: tuple[int, int] | None = None) -> None:
    """Write ``path`` atomically, 0600 from its creation (a fresh temporary file, then a rename);
    ``owner`` (uid, gid) hands it to another user before it appears under its name."""
    with private_file(path, owner) as out:
        out.write(data.encode() if isinstance(data, str) else data)


def write_json(path: Path, value: Any, owner: tuple[int, int] | None = None, indent: int | None = None) -> None:
    write_private(path, json.dumps(value, indent=indent), owner)


def copy_private(source: Path, target: Path, owner: tuple[int, int] | None = None) -> None:
    """Copy ``source`` to ``target`` (streamed), 0600 from its creation."""
    with private_file(target, owner) as out, source.open("rb") as src:
        shutil.copyfileobj(src, out, 1 << 20)


@contextmanager
def private_file(target: Path, owner: tuple[int, int] | None) -> Iterator[BinaryIO]:
    """The one atomic write: a temporary file beside ``target``, 0600 from its creation, renamed over
    it once written (and removed if the writing fails)."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            if owner is not None:
                os.fchown(out.fileno(), *owner)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def session_dir(root: Path, session_id: str) -> Path:
    """``root/<session_id>`` for a well-formed session id only (no path tricks); else ValueError."""
    if not session_id.startswith("ses_") or not session_id[4:].isascii() or not session_id[4:].isalnum():
        raise ValueError(f"not a session id: {session_id!r}")
    return root / session_id


def read_or_make_secret(path: Path, size: int) -> bytes:
    """A key file's bytes; made first (``size`` random bytes, 0600) when there is none. A new key is
    written whole to a temporary file and linked into place, so no reader (another gateway on the
    data dir) ever sees it part-written, and two gateways never end up with two keys (the link fails
    for the second). Raises OSError."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(size))
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):  # another gateway's key won: it is read below
            os.link(temporary, path)
    finally:
        os.unlink(temporary)
    return path.read_bytes()


class SessionStore:
    def __init__(self, data_dir: Path) -> None:
        private_dir(data_dir)  # the whole data directory: nobody else's to enter
        self._dir = private_dir(data_dir / "sessions")

    def save(self, session_id: str, record: dict[str, Any]) -> None:
        write_json(self._dir / f"{session_id}.json", record)

    def delete(self, session_id: str) -> None:
        (self._dir / f"{session_id}.json").unlink(missing_ok=True)

    def load_all(self, parse: Callable[[dict[str, Any]], T]) -> list[T]:
        """Every record ``parse`` accepts. One that is no JSON object or that ``parse`` refuses (a
        ValueError, as pydantic's are) is set aside as ``<name>.unreadable``: kept for an operator to
        look at, never adopted, and not read again at every start."""
        records = []
        for path in sorted(self._dir.glob("*.json")):
            try:
                raw = json.loads(path.read_text())
                if not isinstance(raw, dict):
                    raise ValueError("not a JSON object")
                records.append(parse(raw))
            except (OSError, ValueError) as exc:
                log.error(
                    "session record %s holds no session; set aside as %s.unreadable: %s", path.name, path.name, exc
                )
                with contextlib.suppress(OSError):
                    path.rename(path.with_name(path.name + ".unreadable"))
        return records
