"""What the dynamic loader gives the base's programs, read from an image without running it: each
soname's file (its ``/etc/ld.so.cache``), and the files behind them with every link on the way (a
template that replaced ``libz.so.1.2.13`` behind the ``libz.so.1`` link would change no link). The
check (corral.gateway.templates.check) then holds a template to the base's: no soname resolving
elsewhere, none of those files changed."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from corral.gateway.templates import ldcache
from corral.runtime import SandboxRuntime

LD_CACHE = "/etc/ld.so.cache"
MAX_LD_CACHE = 4 << 20
# The loader itself, which every dynamic program names (PT_INTERP), and the top-level links of a
# merged /usr, through which the cache's /lib paths go.
LOADER_PATHS = ("/lib64/ld-linux-x86-64.so.2", "/lib64", "/lib", "/bin", "/sbin")
LINK_HOPS = 8


@dataclass(frozen=True, slots=True)
class Libraries:
    sonames: dict[str, str]  # soname -> file, as the loader takes it
    files: tuple[str, ...]  # those files, their links' targets, the loader: what the check digests


def read_sonames(runtime: SandboxRuntime, image: str) -> dict[str, str]:
    """``image``'s loader cache, soname -> file; ValueError for one that is missing or unreadable."""
    data = runtime.read_files(image, [LD_CACHE], MAX_LD_CACHE)[LD_CACHE]
    if data is None:
        raise ValueError(f"{LD_CACHE} is missing")
    return ldcache.resolved(data)


def base_libraries(runtime: SandboxRuntime, base: str) -> Libraries:
    """The base's sonames, and every file and link they reach (followed within the base: trusted)."""
    sonames = read_sonames(runtime, base)
    files = set(sonames.values()) | set(LOADER_PATHS)
    pending = set(files)
    for _ in range(LINK_HOPS):
        targets = runtime.link_targets(base, sorted(pending))
        pending = set()
        for path, target in targets.items():
            if target is None:
                continue
            reached = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            if reached not in files:
                files.add(reached)
                pending.add(reached)
        if not pending:
            break
    return Libraries(sonames, tuple(sorted(files)))
