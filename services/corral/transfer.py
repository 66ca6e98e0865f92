"""Moving whole directories between this host and a sandbox: which files an upload sends (file by
file, their directories made as they go), and a downloaded directory's tar unpacked without letting
any member out of the target directory."""

from __future__ import annotations

import os
import posixpath
import tarfile
from pathlib import Path, PurePosixPath

from corral.errors import CorralError
from corral.gateway_client import Download


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


__all__ = ["settle", "unpack", "upload_plan"]
