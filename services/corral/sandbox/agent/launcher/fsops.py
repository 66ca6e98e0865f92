"""File operations as the agent, on the launcher's side: each runs with the agent's effective (and
so filesystem) uid and gid, and answers with what :mod:`os` gave or the errno it raised.

``open`` and ``mkstemp`` hand back a descriptor: the controller reads and writes the data itself,
so big files never pass through the launcher. ``rmtree`` runs in a forked child that is the agent
for good (it may take long; the launcher stays free), see :mod:`corral.sandbox.agent.launcher.server`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat as st
import struct
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from corral.sandbox.agent.launcher import messages as m
from corral.sandbox.agent.launcher.privileges import Ids, acting_as
from corral.sandbox.agent.launcher.privileges import rename as rename2

Outcome = tuple[dict[str, Any], list[int]]  # a reply's fields, descriptors to send (and then close)


def kind(mode: int) -> str:
    if st.S_ISREG(mode):
        return "file"
    if st.S_ISDIR(mode):
        return "directory"
    if st.S_ISLNK(mode):
        return "symlink"
    return "other"


def describe(path: bytes, info: os.stat_result, link: bytes, dir_fd: int | None = None) -> dict[str, Any]:
    """A stat result on the wire (the client makes a FileStat or DirEntry of it); a link's target is
    read at ``link`` (relative to ``dir_fd``: the object stat'ed, never the path resolved again)."""
    out: dict[str, Any] = {
        "path": m.b64(path),
        "type": kind(info.st_mode),
        "size": info.st_size,
        "mode": st.S_IMODE(info.st_mode),
        "mtime": info.st_mtime,
        "target": None,
    }
    if st.S_ISLNK(info.st_mode):
        with contextlib.suppress(OSError):
            out["target"] = m.b64(os.readlink(link, dir_fd=dir_fd))
    return out


# -- resolving a path once ---------------------------------------------------------------------------

_SYS_OPENAT2 = 437  # one number on every architecture that has it (x86_64, aarch64: the generic table)
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02  # /proc/<pid>/fd/N, /proc/<pid>/exe, cwd, root: never followed
_PROC_SUPER_MAGIC = 0x9FA0
_STATFS_BYTES = 256  # larger than struct statfs on every 64-bit ABI; its first field is f_type
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def open_once(path: bytes, flags: int, mode: int = 0) -> int:
    """``path`` opened as the agent, resolved once by the kernel with no magic link followed, and
    refused (EACCES) when what was opened is on a proc filesystem. What is checked is the object the
    action then uses, so a link swapped into the path meanwhile changes nothing: the check
    (:func:`_outside_proc`, on the path) and the use can no longer see two different files."""
    # openat2 refuses a mode without O_CREAT or O_TMPFILE (EINVAL), where open ignores it.
    mode = mode if flags & (os.O_CREAT | os.O_TMPFILE) else 0
    how = struct.pack("QQQ", flags | os.O_CLOEXEC, mode, _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(_SYS_OPENAT2, _AT_FDCWD, path, how, len(how))
    if fd < 0:
        code = ctypes.get_errno()
        if code != errno.ENOSYS:  # a kernel before 5.6 has none: then the fd check below alone
            raise OSError(code, os.strerror(code), path)
        fd = os.open(path, flags | os.O_CLOEXEC, mode)
    try:
        if _on_proc(fd):
            raise PermissionError(errno.EACCES, "file actions do not reach /proc", path)
    except BaseException:
        os.close(fd)
        raise
    return int(fd)


def _on_proc(fd: int) -> bool:
    buffer = ctypes.create_string_buffer(_STATFS_BYTES)
    if _libc.fstatfs(fd, buffer) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(struct.unpack_from("l", buffer.raw)[0]) == _PROC_SUPER_MAGIC


def _open(f: Mapping[str, Any]) -> Outcome:
    return {}, [open_once(f["path"], f["flags"], f["mode"])]


def _stat(f: Mapping[str, Any]) -> Outcome:
    fd = open_once(f["path"], os.O_PATH | (0 if f["follow_symlinks"] else os.O_NOFOLLOW))
    try:
        return {"stat": describe(f["path"], os.fstat(fd), b"", dir_fd=fd)}, []
    finally:
        os.close(fd)


def _scandir(f: Mapping[str, Any]) -> Outcome:
    """Up to ``limit`` entries from position ``skip`` on, whose JSON stays under
    :data:`messages.SCANDIR_REPLY_BYTES`; ``next`` is where to go on when the budget cut it short,
    ``truncated`` that ``limit`` did."""
    entries: list[dict[str, Any]] = []
    held = 0
    truncated = False
    following: int | None = None
    directory = open_once(f["path"], os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(directory) as found:
            for position, entry in enumerate(found):
                if position < f["skip"]:
                    continue
                if len(entries) >= f["limit"]:
                    truncated = True
                    break
                name = os.fsencode(entry.name)  # a listing by descriptor names entries as str
                try:
                    info = entry.stat(follow_symlinks=False)
                    described = describe(os.path.join(f["path"], name), info, name, directory)
                except FileNotFoundError:
                    continue  # removed while listed
                size = len(json.dumps(described, separators=(",", ":"))) + 1
                if entries and held + size > m.SCANDIR_REPLY_BYTES:
                    following = position
                    break
                entries.append(described)
                held += size
    finally:
        os.close(directory)
    return {"entries": entries, "truncated": truncated, "next": following}, []


def _mkdir(f: Mapping[str, Any]) -> Outcome:
    if f["parents"]:
        os.makedirs(f["path"], f["mode"], exist_ok=True)
    else:
        os.mkdir(f["path"], f["mode"])
    return {}, []


def _mkstemp(f: Mapping[str, Any]) -> Outcome:
    fd, path = tempfile.mkstemp(prefix=f["prefix"], dir=f["directory"])
    return {"path": m.b64(path)}, [fd]


def _rename(f: Mapping[str, Any]) -> Outcome:
    rename2(f["source"], f["destination"], replace=f["replace"])
    return {}, []


def _chmod(f: Mapping[str, Any]) -> Outcome:
    os.chmod(f["path"], f["mode"])
    return {}, []


def _unlink(f: Mapping[str, Any]) -> Outcome:
    os.unlink(f["path"])
    return {}, []


def _rmdir(f: Mapping[str, Any]) -> Outcome:
    os.rmdir(f["path"])
    return {}, []


def _openpty(f: Mapping[str, Any]) -> Outcome:
    # Opened as the agent: the terminal's /dev/pts node is the agent's, as a login's would be.
    master, slave = os.openpty()
    return {}, [master, slave]


OPERATIONS: dict[str, Callable[[Mapping[str, Any]], Outcome]] = {
    "open": _open,
    "stat": _stat,
    "scandir": _scandir,
    "mkdir": _mkdir,
    "mkstemp": _mkstemp,
    "rename": _rename,
    "chmod": _chmod,
    "unlink": _unlink,
    "rmdir": _rmdir,
    "openpty": _openpty,
}


_PATH_FIELDS = ("path", "directory", "source", "destination")


def _outside_proc(fields: Mapping[str, Any]) -> None:
    """Refuse a path that leads into /proc. There ``self`` is this launcher, which holds privilege
    (its maps, its descriptors): the agent reads its own processes with its commands instead.
    Checked on the path as resolved now, for a clear refusal; what ``open``, ``stat`` and
    ``scandir`` then use is checked again on the object itself (:func:`open_once`), so a link
    swapped in meanwhile reaches nothing there. The other operations change names and modes only,
    which proc refuses to create, remove or rename, and a magic link leads them only to files the
    agent's effective ids may change anyway."""
    for name in _PATH_FIELDS:
        path = fields.get(name)
        if isinstance(path, bytes) and os.path.realpath(path).split(b"/")[1:2] == [b"proc"]:
            raise PermissionError(errno.EACCES, "file actions do not reach /proc", path)


def run(request: m.Request, agent: Ids, own: Ids) -> Outcome:
    """One file operation as the agent; an OSError becomes the failure reply (errno and path)."""
    try:
        with acting_as(agent, own):
            _outside_proc(request.fields)
            fields, fds = OPERATIONS[request.op](request.fields)
    except OSError as exc:
        path = exc.filename if isinstance(exc.filename, bytes) else None
        return m.failure(request.id, exc.errno or errno.EIO, path), []
    return m.ok(request.id, **fields), fds


def remove_tree(path: bytes) -> int:
    """In a child that became the agent: the whole tree at ``path``; 0 or the errno that stopped it."""
    try:
        info = os.lstat(path)
        if not st.S_ISDIR(info.st_mode):
            os.unlink(path)
        else:
            shutil.rmtree(path)
    except OSError as exc:
        return exc.errno or errno.EIO
    return 0
