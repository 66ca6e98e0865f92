"""What the dynamic loader gives the base's programs, read from an image without running it: each
soname's file (its ``/etc/ld.so.cache``), and the files behind them with every link on the way (a
template that replaced ``libz.so.1.2.13`` behind the ``libz.so.1`` link would change no link). The
check (corral.gateway.templates.check) then holds a template to the base's: no soname resolving
elsewhere, none of those files changed. A directory holding many of them is read as one archive
(hundreds of files); the few elsewhere (the links of a merged /usr) each by itself."""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from corral.gateway.templates import ldcache
from corral.gateway.templates.check import ancestors
from corral.runtime import DirectoryEntry, SandboxRuntime

LD_CACHE = "/etc/ld.so.cache"
MAX_LD_CACHE = 4 << 20
# The loader itself, which every dynamic program names (PT_INTERP), and the top-level links of a
# merged /usr, through which the cache's /lib paths go.
LOADER_PATHS = ("/usr/lib64/ld-linux-x86-64.so.2", "/lib64", "/lib", "/bin", "/sbin")
LINK_HOPS = 8


@dataclass(frozen=True, slots=True)
class Libraries:
    sonames: dict[str, str]  # soname -> file, as the loader takes it
    # Those files, their links' targets, the loader, and every directory on the way to each (the
    # directories' own entries: none of them turned into a link) -> digest: what the check compares.
    digests: dict[str, str]
    bulk: frozenset[str]  # the directories read as one archive each: a template's are read the same way
    cache: dict[str, tuple[ldcache.Entry, ...]]  # every entry of each soname in the base's loader cache


def read_cache(runtime: SandboxRuntime, image: str) -> dict[str, tuple[ldcache.Entry, ...]]:
    """``image``'s loader cache, soname -> its entries; ValueError for one that is missing or unreadable."""
    data = runtime.read_files(image, [LD_CACHE], MAX_LD_CACHE)[LD_CACHE]
    if data is None:
        raise ValueError(f"{LD_CACHE} is missing")
    return ldcache.entries(data)


def first_files(cache: Mapping[str, tuple[ldcache.Entry, ...]]) -> dict[str, str]:
    """Each soname's first file."""
    return {name: listed[0][1] for name, listed in cache.items()}


# A directory is read as one archive when it holds at least this many of the paths asked for (the
# libraries' own: hundreds of files in one request, where one request each took about a minute on a
# loaded host); any other path by an archive of its own, read to its first entry. Reading ``/`` and
# ``/usr`` whole for the four links of a merged /usr streamed the whole image twice (about 7 s each).
BULK_NAMES = 16


def bulk_directories(paths: Iterable[str]) -> frozenset[str]:
    """The directories holding at least ``BULK_NAMES`` of ``paths``."""
    counts = Counter(posixpath.dirname(path) for path in paths)
    return frozenset(directory for directory, count in counts.items() if count >= BULK_NAMES)


def digests_of(entries: Mapping[str, DirectoryEntry | None]) -> dict[str, str]:
    """Each path's digest, ``absent`` where there is nothing."""
    return {path: entry.digest if entry is not None else "absent" for path, entry in entries.items()}


class _Listing:
    """An image's entries as the check asks for them: the ``bulk`` directories each read once (the
    names to digest in each; None: every entry, for paths a link reaches later), every other path by
    itself (those of one round in one request)."""

    def __init__(self, runtime: SandboxRuntime, image: str, bulk: Mapping[str, Collection[str] | None]) -> None:
        self._runtime, self._image, self._bulk = runtime, image, dict(bulk)
        self._directories: dict[str, dict[str, DirectoryEntry]] = {}
        self._paths: dict[str, DirectoryEntry | None] = {}

    def entries(self, paths: Iterable[str]) -> dict[str, DirectoryEntry | None]:
        wanted = list(paths)
        single = [path for path in wanted if posixpath.dirname(path) not in self._bulk and path not in self._paths]
        if single:
            self._paths.update(self._runtime.path_entries(self._image, single))
        return {path: self._entry(path) for path in wanted}

    def _entry(self, path: str) -> DirectoryEntry | None:
        directory, name = posixpath.split(path)
        if directory not in self._bulk:
            return self._paths[path]
        if directory not in self._directories:
            self._directories[directory] = self._runtime.directory_entries(
                self._image, directory, self._bulk[directory]
            )
        return self._directories[directory].get(name)


def base_libraries(runtime: SandboxRuntime, base: str) -> Libraries:
    """The base's sonames, and every file and link they reach (followed within the base: trusted),
    with the directories on the way to each."""
    cache = read_cache(runtime, base)
    # Every entry's file, not only the first of each name: the loader takes the first that fits.
    files = {path for listed in cache.values() for _, path, _, _ in listed} | set(LOADER_PATHS)
    bulk = bulk_directories(files)
    listing = _Listing(runtime, base, dict.fromkeys(bulk))
    files |= ancestors(files)
    pending = set(files)
    for _ in range(LINK_HOPS):
        reached = set()
        for path, entry in listing.entries(sorted(pending)).items():
            if entry is not None and entry.link is not None:
                reached.add(posixpath.normpath(posixpath.join(posixpath.dirname(path), entry.link)))
        reached |= ancestors(reached)
        pending = reached - files
        files |= pending
        if not pending:
            break
    return Libraries(first_files(cache), digests_of(listing.entries(sorted(files))), bulk, cache)


def image_digests(runtime: SandboxRuntime, image: str, base: Libraries) -> dict[str, str]:
    """The base's paths' digests in another image (a template's), each read as the base's was."""
    names: dict[str, set[str]] = {directory: set() for directory in base.bulk}
    for path in base.digests:
        directory, name = posixpath.split(path)
        if directory in names:
            names[directory].add(name)
    return digests_of(_Listing(runtime, image, names).entries(base.digests))
