"""File operations as the agent, on the launcher's side: each runs with the agent's effective (and
so filesystem) uid and gid, and answers with what :mod:`os` gave or the errno it raised.

``open`` and ``mkstemp`` hand back a descriptor: the controller reads and writes the data itself,
so big files never pass through the launcher. ``rmtree`` runs in a forked child that is the agent
for good (it may take long; the launcher stays free), see :mod:`corral.sandbox.launcher.server`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat as st
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from corral.sandbox.launcher import messages as m
from corral.sandbox.launcher.privileges import Ids, acting_as
from corral.sandbox.launcher.privileges import rename as rename2

Outcome = tuple[dict[str, Any], list[int]]  # a reply's fields, descriptors to send (and then close)


def kind(mode: int) -> str:
    if st.S_ISREG(mode):
        return "file"
    if st.S_ISDIR(mode):
        return "directory"
    if st.S_ISLNK(mode):
        return "symlink"
    return "other"


def describe(path: bytes, info: os.stat_result) -> dict[str, Any]:
    """A stat result on the wire (the client makes a FileStat or DirEntry of it)."""
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
            out["target"] = m.b64(os.readlink(path))
    return out


def _open(f: Mapping[str, Any]) -> Outcome:
    fd = os.open(f["path"], f["flags"] | os.O_CLOEXEC, f["mode"])
    return {}, [fd]


def _stat(f: Mapping[str, Any]) -> Outcome:
    return {"stat": describe(f["path"], os.stat(f["path"], follow_symlinks=f["follow_symlinks"]))}, []


def _scandir(f: Mapping[str, Any]) -> Outcome:
    """Up to ``limit`` entries from position ``skip`` on, whose JSON stays under
    :data:`messages.SCANDIR_REPLY_BYTES`; ``next`` is where to go on when the budget cut it short,
    ``truncated`` that ``limit`` did."""
    entries: list[dict[str, Any]] = []
    held = 0
    truncated = False
    following: int | None = None
    with os.scandir(f["path"]) as found:
        for position, entry in enumerate(found):
            if position < f["skip"]:
                continue
            if len(entries) >= f["limit"]:
                truncated = True
                break
            try:
                described = describe(entry.path, entry.stat(follow_symlinks=False))
            except FileNotFoundError:
                continue  # removed while listed
            size = len(json.dumps(described, separators=(",", ":"))) + 1
            if entries and held + size > m.SCANDIR_REPLY_BYTES:
                following = position
                break
            entries.append(described)
            held += size
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
    Checked on the path as resolved now; a link swapped in afterwards reaches only what the
    agent's effective ids may open."""
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
