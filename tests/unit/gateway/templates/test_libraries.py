"""How the check reads the loader's files from an image: the directories that hold many of them as one
archive each, every other path by itself, and the links of a merged /usr followed in the base."""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Sequence
from typing import cast

from corral.gateway.templates import libraries
from corral.gateway.templates.check import CHECKED, CHECKED_PARENTS, ancestors
from corral.gateway.templates.libraries import LD_CACHE, base_libraries, image_digests
from corral.runtime import DirectoryEntry, SandboxRuntime

from ...runtime.ldcachefile import cache

LIBS = "/lib/x86_64-linux-gnu"
# A merged /usr: the top-level links, the loader behind /lib64, and the libraries (one link, many files).
TREE: dict[str, DirectoryEntry] = {
    "/usr": DirectoryEntry(None, "d-usr"),
    LIBS: DirectoryEntry(None, "d-libs"),
    "/lib": DirectoryEntry("usr/lib", "d-lib"),
    "/lib64": DirectoryEntry("usr/lib64", "d-lib64"),
    "/bin": DirectoryEntry("usr/bin", "d-bin"),
    "/sbin": DirectoryEntry("usr/sbin", "d-sbin"),
    "/usr/lib": DirectoryEntry(None, "d-usr-lib"),
    "/usr/lib64": DirectoryEntry(None, "d-usr-lib64"),
    "/usr/bin": DirectoryEntry(None, "d-usr-bin"),
    "/usr/sbin": DirectoryEntry(None, "d-usr-sbin"),
    "/usr/lib64/ld-linux-x86-64.so.2": DirectoryEntry(f"{LIBS}/ld-linux-x86-64.so.2", "d-ld-link"),
    f"{LIBS}/ld-linux-x86-64.so.2": DirectoryEntry(None, "d-ld"),
    f"{LIBS}/libz.so.1": DirectoryEntry("libz.so.1.2.13", "d-libz-link"),
    f"{LIBS}/libz.so.1.2.13": DirectoryEntry(None, "d-libz"),
    **{f"{LIBS}/lib{i}.so.1": DirectoryEntry(None, f"d-lib{i}") for i in range(libraries.BULK_NAMES)},
}
SONAMES = [
    ("libz.so.1", f"{LIBS}/libz.so.1"),
    *((f"lib{i}.so.1", f"{LIBS}/lib{i}.so.1") for i in range(libraries.BULK_NAMES)),
]


class Image:
    """The three reads the check makes of an image, over ``TREE``, each call recorded."""

    def __init__(self, tree: dict[str, DirectoryEntry]) -> None:
        self.tree = tree
        self.directories: list[str] = []
        self.paths: list[list[str]] = []

    def read_files(self, image: str, paths: Sequence[str], limit: int) -> dict[str, bytes | None]:
        return {path: cache(SONAMES) if path == LD_CACHE else None for path in paths}

    def directory_entries(
        self, image: str, directory: str, digested: Collection[str] | None = None
    ) -> dict[str, DirectoryEntry]:
        self.directories.append(directory)
        return {
            posixpath.basename(path): entry
            if digested is None or posixpath.basename(path) in digested
            else DirectoryEntry(entry.link, "")
            for path, entry in self.tree.items()
            if posixpath.dirname(path) == directory
        }

    def path_entries(self, image: str, paths: Sequence[str]) -> dict[str, DirectoryEntry | None]:
        self.paths.append(list(paths))
        return {path: self.tree.get(path) for path in paths}


def test_the_libraries_directory_is_read_whole_and_the_merged_usr_links_each_by_itself() -> None:
    image = Image(TREE)
    found = base_libraries(cast(SandboxRuntime, image), "base")
    assert found.sonames == dict(SONAMES)
    # Every file and link on the way, each with its digest: the loader through /lib64 and /usr/lib64,
    # libz.so.1.2.13 behind its link, the links of the merged /usr and the directories they name.
    assert found.digests["/lib64"] == "d-lib64" and found.digests["/usr/lib64"] == "d-usr-lib64"
    assert found.digests[f"{LIBS}/ld-linux-x86-64.so.2"] == "d-ld"
    assert found.digests[f"{LIBS}/libz.so.1.2.13"] == "d-libz"
    assert found.digests["/usr/lib"] == "d-usr-lib"
    # And every directory on the way to each, by its own entry: /usr, the libraries' directory.
    assert found.digests["/usr"] == "d-usr" and found.digests[LIBS] == "d-libs"
    assert ancestors(found.digests) <= set(found.digests)
    # Never / or /usr as a directory (each is the whole image's tree); the libraries' directory once.
    assert image.directories == [LIBS]
    assert all(posixpath.dirname(path) != LIBS for call in image.paths for path in call)
    assert len(image.paths) <= libraries.LINK_HOPS  # one request a round of links, not one a path


def test_a_templates_digests_match_the_bases_and_a_change_on_either_route_shows() -> None:
    base = base_libraries(cast(SandboxRuntime, Image(TREE)), "base")
    same = Image(TREE)
    assert image_digests(cast(SandboxRuntime, same), "template", base) == base.digests
    assert same.directories == [LIBS]
    changed = {
        **TREE,
        "/usr/lib64": DirectoryEntry(None, "loosened"),  # read by itself
        f"{LIBS}/libz.so.1.2.13": DirectoryEntry(None, "replaced"),  # read with its directory
    }
    digests = image_digests(cast(SandboxRuntime, Image(changed)), "template", base)
    assert {path for path in base.digests if digests[path] != base.digests[path]} == {
        "/usr/lib64",
        f"{LIBS}/libz.so.1.2.13",
    }
    gone = {path: entry for path, entry in TREE.items() if path != "/lib64"}
    assert image_digests(cast(SandboxRuntime, Image(gone)), "template", base)["/lib64"] == "absent"


def test_a_directory_on_the_way_turned_into_a_link_is_seen() -> None:
    """The engine follows the links in a path's directories: with /usr a link to a copy (under a
    mount the template's author fills), every file read through it is the base's. /usr's own entry
    shows the link."""
    base = base_libraries(cast(SandboxRuntime, Image(TREE)), "base")
    relinked = {**TREE, "/usr": DirectoryEntry("workspace/usr", "d-usr-link")}
    digests = image_digests(cast(SandboxRuntime, Image(relinked)), "template", base)
    assert {path for path in base.digests if digests[path] != base.digests[path]} == {"/usr"}


def test_the_checked_paths_directories_are_compared_by_their_own_entries() -> None:
    """/opt (for /opt/corral), /etc (for the preload list), /usr: each checked path's directories."""
    assert {"/opt", "/etc", "/usr", "/usr/bin", "/usr/share/corral"} <= set(CHECKED_PARENTS)
    assert ancestors(CHECKED) <= set(CHECKED_PARENTS) | set(CHECKED)
    assert "/" not in CHECKED_PARENTS
