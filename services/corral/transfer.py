"""Moving whole directories between this host and a sandbox: which files an upload sends (file by
file, their directories made as they go), and a downloaded directory's tar unpacked without letting
any member out of the target directory."""

from __future__ import annotations

import os
import posixpath
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from corral.errors import CorralError
from corral.gateway_client import Download

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


def _contained(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo | None:
    """tarfile's ``data`` filter (no absolute names, no ``..`` out, no links out, no devices, no
    set-id bits), and before it a plain check of the name, so no member lands outside ``destination``."""
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts:
        raise tarfile.OutsideDestinationError(member, str(Path(destination, member.name)))
    return tarfile.data_filter(member, destination)


def unpack(archive: Path, target: Path) -> None:
    """The tar at ``archive`` unpacked into ``target`` (made if missing), read as a stream in one pass;
    raises :class:`CorralError` at a member that would leave ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, mode="r|*") as tar:
            tar.extractall(target, filter=_contained)
    except tarfile.FilterError as exc:
        raise CorralError(f"refused to unpack {archive.name}: {exc}") from None
    except tarfile.TarError as exc:
        raise CorralError(f"{archive.name} is no tar archive: {exc}") from None


def settle(download: Download, local: Path) -> Path:
    """A finished download in its place: a file renamed to ``local``, a directory's tar unpacked into it."""
    if not download.is_tar:
        download.path.replace(local)
        return local
    try:
        unpack(download.path, local)
    finally:
        download.path.unlink(missing_ok=True)
    return local


__all__ = ["Remote", "local_target", "remote_target", "settle", "unpack", "upload_plan"]
