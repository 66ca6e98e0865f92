"""The few kernel calls the launcher needs that :mod:`os` lacks (prctl, capset, renameat2), through
libc, and the switch to the agent's uid for one batch of file calls.

Everything here runs in the launcher or a process it forked: single-threaded, so a change of the
effective uid holds for exactly the calls made under it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import NamedTuple

# By its soname, as ctypes.util.find_library("c") answers on glibc: that lookup runs ``ldconfig -p``
# in a subprocess at every launcher start and imports subprocess, threading, random and more into
# the process every shepherd and command child is forked from (each fork copies its page tables,
# each exec tears them down).
_libc = ctypes.CDLL("libc.so.6", use_errno=True)

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
AT_FDCWD = -100
RENAME_NOREPLACE = 1


def _check(result: int, what: str, path: str | bytes | None = None) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", path)


def prctl(option: int, arg: int = 0, arg3: int = 0) -> None:
    _check(
        _libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(arg3), ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl"
    )


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Empty the ambient, effective, permitted and inheritable sets of this process.

    Needed before exec as the agent: a change between two non-root uids keeps capabilities, and
    ambient ones would survive execve."""
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def rename(source: bytes, destination: bytes, *, replace: bool) -> None:
    """rename(2), or renameat2 with RENAME_NOREPLACE (EEXIST rather than replacing)."""
    if replace:
        os.rename(source, destination)
        return
    result = _libc.renameat2(AT_FDCWD, source, AT_FDCWD, destination, RENAME_NOREPLACE)
    _check(result, "rename", source)


class Ids(NamedTuple):
    """A user and group id pair (the launcher's own, or the agent's)."""

    uid: int
    gid: int


@contextlib.contextmanager
def acting_as(agent: Ids, own: Ids) -> Iterator[None]:
    """Effective (and so filesystem) uid and gid switched to ``agent`` for the calls inside; the real
    and saved ids stay ``own``, so the switch back needs no capability."""
    os.setegid(agent.gid)
    os.seteuid(agent.uid)
    try:
        yield
    finally:
        os.seteuid(own.uid)
        os.setegid(own.gid)


def become(agent: Ids) -> None:
    """For good, in a forked child: every uid and gid the agent's, no supplementary groups, no
    capabilities left in any set (the bounding set no longer matters: no_new_privs holds)."""
    os.setgroups([])
    os.setresgid(agent.gid, agent.gid, agent.gid)
    os.setresuid(agent.uid, agent.uid, agent.uid)
    drop_capabilities()
