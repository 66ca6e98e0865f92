"""What makes a built template one the gateway will start: it adds software and cannot weaken the
sandbox. Pure judges of what the runtime read of the template's image and of its base:

- its configuration: the base's entrypoint, command, user, healthcheck and volumes, its environment
  kept (a new variable only where none of the boot's programs reads it);
- its layers: the base's, then its own (a start checks this again, cheaply: a template built on an
  older base is refused with "rebuild it");
- the base's own paths (:data:`CHECKED`) unchanged, read through the engine's archive API (nothing
  of the image runs for it), but for the two files the finishing stage writes;
- its users: the base's four as they were (uids, groups, the browser in the agent's group), and no
  new user or group with one of their numbers;
- no setuid or setgid file the base does not have.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence

from corral.gateway.templates.spec import PROTECTED
from corral.runtime import ImageInfo

# Read by the boot (as root) and the base's programs: the boot's Python and what it imports first,
# the loader's preload list, and the base's own paths.
CHECKED = (
    *(path for path in PROTECTED if path not in ("/usr/share/corral", "/etc/passwd", "/etc/group")),
    "/usr/share/corral/ca-certificates.crt",
    "/usr/share/corral/openbox",
    "/usr/lib/python3.11",
    "/usr/bin/python3.11",
    # The venv's interpreter is a chain of links: /opt/corral/bin/python -> python3 -> /usr/bin/python3
    # -> python3.11. Each link of it, or the boot (root) runs whatever the template points it at.
    "/usr/bin/python3",
    # Where Python looks for its standard library before /usr/lib/python3.11 (its zip, a build tree's
    # marker and directories): absent in the base, absent in a template, or a file there is imported
    # as root before anything else (encodings), whatever flags the boot's Python runs with.
    "/usr/lib/python311.zip",
    "/usr/bin/pybuilddir.txt",
    "/usr/bin/Modules",
    "/usr/bin/Lib",
    "/usr/Lib",
    "/Lib",
    "/etc/python3.11",
    "/etc/ld.so.preload",
    # Which modules the C library loads to look a user up (the boot does, as root, before it drops):
    # a template's line naming its own module there would run it.
    "/etc/nsswitch.conf",
    # What boot runs as root with NET_ADMIN and the supervisor with SETUID (by these paths, never by
    # PATH: corral.sandbox.startup.boot.SYSTEM_PATH), each link of the chain to the program itself.
    "/usr/bin/setpriv",
    "/usr/sbin/iptables-restore",
    "/usr/sbin/ip6tables-restore",
    "/etc/alternatives/iptables-restore",
    "/etc/alternatives/ip6tables-restore",
    "/usr/sbin/iptables-nft-restore",
    "/usr/sbin/ip6tables-nft-restore",
    "/usr/sbin/xtables-nft-multi",
    # What the supervisor starts as corral and as browser, by these paths (never by PATH), and what
    # Chromium's launcher script reads as it starts: a template's own may not stand in for them.
    "/usr/bin/Xvfb",
    "/usr/bin/xkbcomp",  # Xvfb runs it (through /bin/sh) as it starts, as corral
    "/usr/bin/openbox",
    "/usr/bin/chromium",
    "/usr/lib/chromium",
    "/etc/chromium",
    "/etc/chromium.d",
    "/usr/bin/certutil",
    # The modules certutil and Chromium's NSS open by path (softoken, freebl, the built-in roots), as
    # the browser: the loader cache need not list them.
    "/usr/lib/x86_64-linux-gnu/libsoftokn3.so",
    "/usr/lib/x86_64-linux-gnu/libfreeblpriv3.so",
    "/usr/lib/x86_64-linux-gnu/libfreebl3.so",
    "/usr/lib/x86_64-linux-gnu/libnssckbi.so",
    "/usr/bin/mkdir",
    "/usr/bin/xclip",
    "/usr/bin/tini",
    "/usr/bin/sh",
    "/usr/bin/dash",
)


def ancestors(paths: Iterable[str]) -> set[str]:
    """Every directory above each path but ``/``. The engine follows links in a path's directories
    (the path's own last part it does not): a read of ``/usr/lib64/x`` goes through a ``/usr`` that a
    template turned into a link to a copy elsewhere, and finds the copy. So these are compared too,
    each by its own entry, which a link shows as one (docs/design/0479)."""
    found: set[str] = set()
    for path in paths:
        directory = posixpath.dirname(path)
        while directory not in ("/", ""):
            found.add(directory)
            directory = posixpath.dirname(directory)
    return found


# The directories on the way to each checked path, each compared by its own entry (``ancestors``; a
# checked path's own digest already shows it as a link).
CHECKED_PARENTS = tuple(sorted(ancestors(CHECKED) - set(CHECKED)))
BASE_USERS = ("root", "corral", "agent", "browser")
# Environment variables the boot or its Python, the loader, or the base's programs read: a template's
# image may not set them (commands get a template's environment from its file, not from the image's).
_BOOT_ENV = re.compile(r"(LD_|PYTHON|CORRAL_|GCONV_|LOCPATH$|HOSTALIASES$|RES_OPTIONS$|LOCALDOMAIN$|TZDIR$|NSS_)")


def config_refusals(base: ImageInfo, image: ImageInfo) -> list[str]:
    """What the template's configuration changed that is the base's."""
    out = []
    for what, mine, theirs in (
        ("ENTRYPOINT", image.entrypoint, base.entrypoint),
        ("CMD", image.cmd, base.cmd),
        ("USER", image.user or "root", base.user or "root"),
        ("HEALTHCHECK", image.healthcheck, base.healthcheck),
        ("VOLUME", image.volumes, base.volumes),
    ):
        if mine != theirs:
            out.append(f"it changes {what} (the base's boot and its users are not a template's to change)")
    out += env_refusals(base.env, image.env)
    return out


def _env_map(entries: Sequence[str]) -> dict[str, str]:
    return dict(entry.partition("=")[::2] for entry in entries)


def env_refusals(base: Sequence[str], image: Sequence[str]) -> list[str]:
    theirs, mine = _env_map(base), _env_map(image)
    out = [f"it changes the base's {name}" for name, value in theirs.items() if mine.get(name) != value]
    out += [
        f"its ENV sets {name}, which the sandbox's boot reads"
        for name in mine
        if name not in theirs and _BOOT_ENV.match(name)
    ]
    return out


def added_env(base: Sequence[str], image: Sequence[str]) -> dict[str, str]:
    """The variables the template's image sets that the base's does not (a Dockerfile's ENV lines)."""
    theirs = _env_map(base)
    return {name: value for name, value in _env_map(image).items() if name not in theirs}


def on_base(base: ImageInfo, image: ImageInfo) -> bool:
    """Whether ``image`` is built on ``base`` as it is now: its first layers are the base's."""
    return image.layers[: len(base.layers)] == base.layers and len(image.layers) >= len(base.layers)


def path_refusals(base: Mapping[str, str], image: Mapping[str, str]) -> list[str]:
    return [f"it changes {path}, which is the base's" for path in sorted(base) if image.get(path) != base[path]]


def setuid_refusals(base: Sequence[str], image: Sequence[str]) -> list[str]:
    known = set(base)
    return [f"it adds the setuid or setgid file {path}" for path in image if path not in known]


def _entries(text: str, limit: int = 4096) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines()[:limit]:
        fields = line.split(":")
        if fields and fields[0]:
            out.setdefault(fields[0], fields)
    return out


def users_refusals(base_passwd: str, passwd: str, base_group: str, group: str) -> list[str]:
    """The base's users and groups as they were (the uid split), and no newcomer with their numbers.
    ``passwd`` and ``group`` are the template's files (bounded: the first 4096 lines)."""
    out: list[str] = []
    for kind, theirs, mine, number_at in (
        ("user", _entries(base_passwd), _entries(passwd), 2),
        ("group", _entries(base_group), _entries(group), 2),
    ):
        numbers = {fields[number_at] for name, fields in theirs.items() if name in BASE_USERS and len(fields) > 2}
        for name in BASE_USERS:
            if name in theirs and mine.get(name) != theirs[name]:
                out.append(f"it changes the {kind} {name}")
        for name, fields in mine.items():
            if name not in theirs and len(fields) > number_at and fields[number_at] in numbers:
                out.append(f"its new {kind} {name} takes the number {fields[number_at]} of one of the base's")
    return out
