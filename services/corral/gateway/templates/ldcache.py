"""The dynamic loader's cache (``/etc/ld.so.cache``, glibc's ``glibc-ld.so.cache1.1`` format) read
without running anything: which file each library name (soname) resolves to. A template may add
libraries; it may not make a name the base's programs load (its boot as root among them) resolve to
another file, as a library dropped into ``/usr/local/lib`` and an ``ldconfig`` would. Pure."""

from __future__ import annotations

import struct
from collections.abc import Mapping

MAGIC = b"glibc-ld.so.cache1.1"
_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, extension offset
_ENTRY = struct.Struct("<iIIIQ")  # flags, key (soname), value (path), osversion, hwcap
MAX_ENTRIES = 1 << 16


def _string(data: bytes, start: int, offset: int) -> str:
    at = start + offset
    end = data.find(b"\0", at)
    if at >= len(data) or end < 0:
        raise ValueError("a string out of the cache")
    return data[at:end].decode("utf-8", "replace")


# One entry of a soname: its flags (the ABI and the architecture it is for), its file, the OS
# version and the hardware capabilities it asks for.
Entry = tuple[int, str, int, int]


def entries(data: bytes) -> dict[str, tuple[Entry, ...]]:
    """Every entry of each soname, in the cache's order; ValueError for what is not a loader cache of
    this format. The loader takes the first entry whose flags and hardware capabilities fit the
    machine, which need not be the first of the name: an entry for another architecture before the
    base's hides nothing from it."""
    start = data.find(MAGIC)
    if start < 0 or len(data) < start + _HEADER.size:
        raise ValueError("not a glibc ld.so.cache (format 1.1)")
    _, count, _, _, _ = _HEADER.unpack_from(data, start)
    if count > MAX_ENTRIES or start + _HEADER.size + count * _ENTRY.size > len(data):
        raise ValueError("a loader cache whose entries do not fit it")
    found: dict[str, list[Entry]] = {}
    for index in range(count):
        flags, key, value, osversion, hwcap = _ENTRY.unpack_from(data, start + _HEADER.size + index * _ENTRY.size)
        found.setdefault(_string(data, start, key), []).append((flags, _string(data, start, value), osversion, hwcap))
    return {name: tuple(listed) for name, listed in found.items()}


def changed(base: Mapping[str, tuple[Entry, ...]], image: Mapping[str, tuple[Entry, ...]]) -> list[str]:
    """The base's sonames whose entries (each one's flags, file, OS version and hardware capabilities,
    in order) the image changes while the first file stays the base's (``shadowed`` says the rest), as
    refusals: the loader may take another of them on this machine."""
    return [
        f"it changes the loader cache's entries for {name} (which file the loader takes for it)"
        for name, listed in sorted(base.items())
        if image.get(name) != listed and image.get(name, ((0, "", 0, 0),))[0][1] == listed[0][1]
    ]


def shadowed(base: Mapping[str, str], image: Mapping[str, str]) -> list[str]:
    """The base's sonames that resolve to another file in the image (or to none), as refusals."""
    return [
        f"it makes the loader take {name} from {image.get(name, 'nowhere')} rather than the base's {path}"
        for name, path in sorted(base.items())
        if image.get(name) != path
    ]
