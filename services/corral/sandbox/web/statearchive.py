"""A browser profile's state as an archive: Chromium's cookies, local storage and IndexedDB (no caches,
no history, no preferences), packed from a user data dir and unpacked into a staging directory.

An archive to unpack was made by a sandbox, so it is an attacker's: every member is checked before a
byte of it is written (a regular file or a directory, under one of :data:`KEPT` only, no absolute or
``..`` path, no link or device), the members' count and their sizes together are capped, and files
are written by this code with ``O_EXCL|O_NOFOLLOW`` (never ``tarfile.extract``). Standard library
and corral.errors only: it runs inside the sandbox as the browser's uid (corral.sandbox.web.stateswap)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from corral.errors import StateRefused, StateTooLarge

# What a profile keeps, relative to the user data dir: the cookie store, localStorage (a LevelDB),
# IndexedDB and the storage buckets' databases (WebStorage, where newer Chromium keeps non-default
# buckets and their quota). Everything else (caches, history, Preferences, Local State) stays behind.
KEPT: tuple[str, ...] = (
    "Default/Cookies",
    "Default/Cookies-journal",
    "Default/Local Storage",
    "Default/IndexedDB",
    "Default/WebStorage",
)
MAX_MEMBERS = 20_000
_CHUNK = 1 << 16


def member_problem(name: str, kind: str) -> str | None:
    """Why a member named ``name`` of ``kind`` (``file``, ``dir`` or anything else) is refused; None
    when it may be unpacked. Pure."""
    if kind not in ("file", "dir"):
        return f"{name!r} is a {kind}: only regular files and directories"
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return f"{name!r} is not a relative path"
    parts = PurePosixPath(name).parts
    if any(part in ("..", ".") for part in name.split("/")) or not parts:
        return f"{name!r} has a '.' or '..' component"
    path = "/".join(parts)
    if kind == "dir" and path in ("Default",):
        return None
    if not any(path == kept or path.startswith(kept + "/") for kept in KEPT):
        return f"{name!r} is not part of a profile's state (cookies, local storage, IndexedDB)"
    return None


def _kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym() or member.islnk():
        return "link"
    return "device or special file"


def pack(user_data_dir: Path, max_bytes: int) -> bytes:
    """The state under ``user_data_dir`` as a gzipped tar; :class:`StateTooLarge` past ``max_bytes``
    of files. Links and special files in the profile are left out (never followed)."""
    buffer = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        for kept in KEPT:
            for path in _walk(user_data_dir / kept):
                info = path.lstat()
                name = path.relative_to(user_data_dir).as_posix()
                member = tarfile.TarInfo(name)
                member.mtime = int(info.st_mtime)
                if stat.S_ISDIR(info.st_mode):
                    member.type, member.mode = tarfile.DIRTYPE, 0o700
                    archive.addfile(member)
                    continue
                total += info.st_size
                if total > max_bytes:
                    raise StateTooLarge(f"the browser's state is over {max_bytes} bytes")
                member.size, member.mode = info.st_size, 0o600
                with open(path, "rb", opener=_no_follow) as source:
                    archive.addfile(member, source)
    return buffer.getvalue()


def _walk(top: Path) -> list[Path]:
    """``top`` and what is under it, directories before their contents; links and special files left out."""
    try:
        info = top.lstat()
    except FileNotFoundError:
        return []
    if stat.S_ISREG(info.st_mode):
        return [top]
    if not stat.S_ISDIR(info.st_mode):
        return []
    found = [top]
    for child in sorted(top.iterdir()):
        found.extend(_walk(child))
    return found


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def unpack(data: bytes, staging: Path, max_bytes: int) -> int:
    """Every member of ``data`` checked, then written under ``staging`` (a new directory); the bytes
    written. :class:`StateRefused` (with the first bad member) or :class:`StateTooLarge` before
    anything is left half-written: the caller drops ``staging`` on any failure."""
    if len(data) > max_bytes:
        raise StateTooLarge(f"the archive is over {max_bytes} bytes")
    staging.mkdir(mode=0o700)
    total = 0
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")  # noqa: SIM115 (closed by the with below)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise StateRefused(f"not a gzipped tar: {exc}") from None
    with archive:
        for member in _checked(archive, max_bytes):
            target = staging.joinpath(*PurePosixPath(member.name).parts)
            try:
                if member.isdir():
                    target.mkdir(mode=0o700, parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                _write(archive, member, target)
            except OSError as exc:  # a member twice, a file where a directory is: the archive's fault
                raise StateRefused(f"{member.name!r} cannot be written: {exc.strerror or exc}") from None
            except (tarfile.TarError, EOFError, zlib.error) as exc:
                raise StateRefused(f"{member.name!r} cannot be read: {exc}") from None
            total += member.size
    return total


def _checked(archive: tarfile.TarFile, max_bytes: int) -> list[tarfile.TarInfo]:
    """Every member, each checked as its header is read (before the next is decompressed): a bad
    one, too many or too many bytes together is a refusal, so no archive makes this read far past
    ``max_bytes`` (a gzip bomb stops at the first header that declares too much)."""
    found: list[tarfile.TarInfo] = []
    total = 0
    while True:
        try:
            member = archive.next()
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise StateRefused(f"a corrupt archive: {exc}") from None
        if member is None:
            return found
        problem = member_problem(member.name, _kind(member))
        if problem is not None:
            raise StateRefused(problem)
        total += member.size if member.isreg() else 0
        if total > max_bytes:
            raise StateTooLarge(f"the archive's files are over {max_bytes} bytes")
        found.append(member)
        if len(found) > MAX_MEMBERS:
            raise StateRefused(f"more than {MAX_MEMBERS} members")


def _write(archive: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    source = archive.extractfile(member)
    if source is None:
        raise StateRefused(f"{member.name!r} has no data")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    left = member.size
    with os.fdopen(fd, "wb") as out:
        while left > 0:
            chunk = source.read(min(_CHUNK, left))
            if not chunk:
                raise StateRefused(f"{member.name!r} is cut short")
            out.write(chunk)
            left -= len(chunk)
