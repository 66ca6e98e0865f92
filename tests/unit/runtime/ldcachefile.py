"""A glibc loader cache (``glibc-ld.so.cache1.1``) written for the tests, entry by entry."""

from __future__ import annotations

import struct

from corral.gateway.templates.ldcache import MAGIC


def cache(entries: list[tuple[str, str]]) -> bytes:
    """The cache of ``(soname, file)`` entries, in this order (the loader's: the first of a name wins)."""
    header_size, entry_size = 48, 24
    strings = bytearray()
    offsets: list[tuple[int, int]] = []
    base = header_size + entry_size * len(entries)  # string offsets count from the header's start
    for name, path in entries:
        key = base + len(strings)
        strings += name.encode() + b"\0"
        value = base + len(strings)
        strings += path.encode() + b"\0"
        offsets.append((key, value))
    header = struct.pack("<20sIIB3xI12x", MAGIC, len(entries), len(strings), 0, 0)
    body = b"".join(struct.pack("<iIIIQ", 0x303, key, value, 0, 0) for key, value in offsets)
    return header + body + bytes(strings)
