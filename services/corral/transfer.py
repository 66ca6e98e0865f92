"""Moving whole directories between this host and a sandbox: which files an upload sends (file by
file, their directories made as they go), and a downloaded directory's tar unpacked by our own
extractor (not tarfile's, whose filters have had bypasses): nothing but regular files and directories,
nothing outside the target, nothing there until all of it is."""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from corral.errors import ArchiveRefused, CorralError
from corral.gateway_client import Download

_CHUNK = 1 << 20
_REMOTE = re.compile(r"^(ses_[A-Za-z0-9]+):(.*)$")


@dataclass(frozen=True, slots=True)
class Remote:
    """``ID:/path``: a path in a session's sandbox, as ``corral cp`` takes it."""

    session_id: str
    path: str

    @classmethod
    def parse(cls, text: str) -> Remote | None:
        """The remote ``text`` names, or None for a local path."""
        found = _REMOTE.match(text)
        if found is None:
            return None
        return cls(found.group(1), found.group(2) or "/workspace")


def remote_target(local: Path, remote: str) -> str:
    """Where a local file goes: into ``remote`` when that names a directory (ends with ``/``)."""
    return posixpath.join(remote, local.name) if remote.endswith("/") else remote


def may_be_directory(local: Path, remote: str) -> bool:
    """Whether where a local file goes depends on what ``remote`` is (a file sent to a path without a
    trailing ``/``, which may be an existing directory: then it goes inside, as cp does)."""
    return not local.is_dir() and not remote.endswith("/")


def local_target(remote: str, local: Path) -> Path:
    """Where a download lands: inside ``local`` when that is an existing directory, as cp does."""
    name = posixpath.basename(remote.rstrip("/")) or "root"
    return local / name if local.is_dir() else local


def upload_plan(local: Path, remote: str) -> list[tuple[Path, str]]:
    """Each regular file under ``local`` and the path it goes to under ``remote``, in a stable order.
    Symbolic links are not followed (one could point anywhere on this host); empty directories are
    not made (a directory is made when a file goes into it)."""
    if not local.is_dir():
        return [(local, remote)]
    plan: list[tuple[Path, str]] = []
    for root, dirs, files in os.walk(local, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = Path(root, name)
            if path.is_symlink() or not path.is_file():
                continue
            relative = path.relative_to(local).as_posix()
            plan.append((path, posixpath.join(remote, relative)))
    return plan


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OLD_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_END_BLOCK = bytes(tarfile.BLOCKSIZE)


def _parts(name: str) -> tuple[str, ...]:
    """A member's name as path components under the target; refused when absolute or with ``..``."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise ArchiveRefused(f"{name!r} would land outside the target")
    return tuple(part for part in path.parts if part != ".")


def _open_dir(root: int, parts: tuple[str, ...], *, make: bool) -> int:
    """The directory ``parts`` below the fd ``root``, walked one component at a time with no link
    followed (made as it goes when ``make``); an fd the caller closes."""
    fd = os.dup(root)
    try:
        for part in parts:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            child = os.open(part, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _safe_mode(mode: int, owner: int) -> int:
    """tarfile's ``data`` filter's rule: no set-id or sticky bits, nobody but the owner writes."""
    return (mode & 0o755) | owner


class _Tree:
    """A fresh directory filled member by member: each file made with O_CREAT|O_EXCL|O_NOFOLLOW in a
    directory opened by fd, so no name can reach outside it, nor replace what is already there."""

    def __init__(self, root: int) -> None:
        self._root = root
        self._seen: set[tuple[str, ...]] = set()
        self._files: set[tuple[str, ...]] = set()

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> bool:
        """``member`` unpacked; False when it was skipped (a link or a device: never made here)."""
        parts = _parts(member.name)
        if parts in self._seen:
            raise ArchiveRefused(f"{member.name!r} appears twice")
        self._seen.add(parts)
        if member.isdir():
            fd = _open_dir(self._root, parts, make=True)
            try:
                os.fchmod(fd, _safe_mode(member.mode, 0o700))
            finally:
                os.close(fd)
        elif member.isreg() and parts:
            source = tar.extractfile(member)
            assert source is not None  # a regular member always has its data
            self._write(parts, member, source)
        elif member.islnk() and parts:
            self._link(parts, member)
        else:
            return False  # a symbolic link, a device, a fifo: left out (one could point anywhere here)
        return True

    def _write(self, parts: tuple[str, ...], member: tarfile.TarInfo, source: IO[bytes]) -> None:
        parent = _open_dir(self._root, parts[:-1], make=True)
        try:
            fd = os.open(parts[-1], _NEW_FILE, 0o600, dir_fd=parent)
        except FileExistsError:
            raise ArchiveRefused(f"{member.name!r} names something already unpacked") from None
        finally:
            os.close(parent)
        with os.fdopen(fd, "wb") as out:
            copied = 0
            while chunk := source.read(_CHUNK):
                copied += out.write(chunk)
            if copied != member.size:
                raise ArchiveRefused(f"{member.name!r} is cut short ({copied} of {member.size} bytes)")
            os.fchmod(fd, _safe_mode(member.mode, 0o600))
            os.utime(fd, (member.mtime, member.mtime))
        self._files.add(parts)

    def _link(self, parts: tuple[str, ...], member: tarfile.TarInfo) -> None:
        """A hard link made a link to the file it names, when that is a file unpacked before (so a farm
        of links to one big file costs its size once here too, as in the sandbox and in the tar)."""
        linked = _parts(member.linkname)
        if linked not in self._files:
            raise ArchiveRefused(f"{member.name!r} links to {member.linkname!r}, no file unpacked before it")
        source = _open_dir(self._root, linked[:-1], make=False)
        try:
            parent = _open_dir(self._root, parts[:-1], make=True)
            try:
                os.link(linked[-1], parts[-1], src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)
            except FileExistsError:
                raise ArchiveRefused(f"{member.name!r} names something already unpacked") from None
            finally:
                os.close(parent)
        finally:
            os.close(source)
        self._files.add(parts)


def _unpack_into(archive: Path, root: int) -> list[str]:
    """Every member of ``archive`` unpacked below the fd ``root``; the names left out. Refused when
    the archive ends before tar's end-of-archive block (a download cut short at a member boundary)."""
    skipped: list[str] = []
    with archive.open("rb") as raw, tarfile.open(fileobj=raw, mode="r:") as tar:
        tree = _Tree(root)
        while (member := tar.next()) is not None:
            if not tree.add(tar, member):
                skipped.append(member.name)
        raw.seek(tar.offset)
        if raw.read(tarfile.BLOCKSIZE) != _END_BLOCK:
            raise ArchiveRefused("the archive is cut short (no end-of-archive block)")
    return skipped


def unpack(archive: Path, target: Path) -> list[str]:
    """The tar at ``archive`` unpacked to ``target`` (which must not exist, or be an empty directory):
    only regular files and directories, each made below a fresh directory beside ``target`` that is
    renamed into place once every member is in, so a refused or failed unpack leaves nothing. Symbolic
    links, devices and fifos are left out (their names returned); a hard link becomes a link to the file
    it names (made before it in the same fresh tree). Raises :class:`CorralError` for a member that
    would leave ``target`` or replace another, and for an archive that is cut short."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".unpacking", dir=target.parent))
    try:
        root = os.open(scratch, _DIRECTORY)
        try:
            os.fchmod(root, 0o755)  # unless the archive's own "." says otherwise
            skipped = _unpack_into(archive, root)
        finally:
            os.close(root)
        os.rename(scratch, target)
    except ArchiveRefused as exc:
        raise ArchiveRefused(f"refused to unpack {archive.name}: {exc}") from None
    except tarfile.TarError as exc:
        raise CorralError(f"{archive.name} is no tar archive: {exc}") from None
    except OSError as exc:
        raise CorralError(f"cannot unpack {archive.name} to {target}: {exc.strerror}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return skipped


def settle(download: Download, local: Path, skipped: Callable[[list[str]], None] | None = None) -> Path:
    """A finished download in its place: a file renamed to ``local``, a directory's tar unpacked to it
    (see :func:`unpack`; ``skipped`` hears the names left out, if any)."""
    if not download.is_tar:
        download.path.replace(local)
        return local
    try:
        left_out = unpack(download.path, local)
    finally:
        download.path.unlink(missing_ok=True)
    if left_out and skipped is not None:
        skipped(left_out)
    return local


__all__ = ["Remote", "local_target", "may_be_directory", "remote_target", "settle", "unpack", "upload_plan"]
