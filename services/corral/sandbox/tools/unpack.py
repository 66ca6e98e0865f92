"""A paused session's directory archive put back, inside the new sandbox and as the agent: the gateway
uploads the archive the old sandbox's tar made and runs ``python -I -m corral.sandbox.tools.unpack
ARCHIVE TARGET MAX_BYTES`` as the agent (the ``exec`` action). The archive came from the sandbox,
so it is an attacker's: the host never extracts it, and here each member is checked before it is
written: regular files, directories and links only (no devices, fifos or sockets), no absolute path,
no ``..``, nothing written through a link that resolves outside the target (each member's place
resolved against the disk as it is then, as a chain of links resolves), no hard link to a file
outside, no setuid/setgid bits, and a cap on the bytes written. Symbolic links themselves are made
as they are, wherever they point: ``ln -s`` is the agent's own power. The first refused
member stops the restore with its reason on stderr (exit 2); the archive is removed either way.

Not ``tarfile``'s ``data`` filter: bookworm's Python 3.11.2 predates it."""

from __future__ import annotations

import contextlib
import os
import sys
import tarfile
from dataclasses import dataclass

from corral.errors import ArchiveRefused as Refused

EXIT_REFUSED = 2
_MODE_BITS = 0o777  # setuid, setgid and sticky dropped


@dataclass(frozen=True, slots=True)
class Unpacked:
    files: int
    bytes: int


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def check_name(name: str) -> str:
    """The member's relative path, or Refused (absolute, ``..``, empty)."""
    if name.startswith("/") or "\x00" in name:
        raise Refused(f"{name!r}: an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"{name!r}: a path with ..")
    return "/".join(parts)


def check_member(member: tarfile.TarInfo, root: str) -> str:
    """Where under ``root`` the member goes (resolved against the disk as it is now), or Refused."""
    relative = check_name(member.name)
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise Refused(f"{member.name!r}: not a file, directory or link")
    destination = os.path.realpath(os.path.join(root, relative)) if relative else root
    parent = os.path.realpath(os.path.dirname(os.path.join(root, relative))) if relative else root
    if not _inside(root, parent) or not _inside(root, destination):
        raise Refused(f"{member.name!r}: outside the target")
    # A symbolic link is made as it is, wherever it points (a venv's bin/python -> /usr/bin/python3,
    # node_modules/.bin): making one is what the agent can do itself with ln -s. What is refused is
    # writing through one: every member's own place and its parent are resolved on disk above, so a
    # later member under a link that leads out, or on a link's name, never lands outside.
    if member.islnk():
        pointed = os.path.realpath(os.path.join(root, check_name(member.linkname)))
        if not _inside(root, pointed):
            raise Refused(f"{member.name!r}: a hard link out of the target")
    return relative


def unpack(archive: str, target: str, max_bytes: int) -> Unpacked:
    """Every member of ``archive`` written under ``target``, each checked as it comes; Refused at the
    first one that may not be, or once the files' bytes pass ``max_bytes``."""
    root = os.path.realpath(target)
    os.makedirs(root, exist_ok=True)
    files = written = 0
    with tarfile.open(archive, mode="r:") as tar:
        for member in tar:
            check_member(member, root)
            written += member.size if member.isreg() else 0
            if written > max_bytes:
                raise Refused(f"the archive holds more than {max_bytes} bytes")
            member.mode &= _MODE_BITS
            member.uid = member.gid = os.getuid()
            member.uname = member.gname = ""
            tar.extract(member, root, set_attrs=not member.issym(), numeric_owner=True)
            files += 1
    return Unpacked(files, written)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: unpack ARCHIVE TARGET MAX_BYTES", file=sys.stderr)
        return EXIT_REFUSED
    archive, target, limit = argv
    try:
        done = unpack(archive, target, int(limit))
    except (Refused, tarfile.TarError, OSError, ValueError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        with contextlib.suppress(OSError):
            os.unlink(archive)
    print(f"{done.files} {done.bytes}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
