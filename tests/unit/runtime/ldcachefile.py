"""A glibc loader cache (``glibc-ld.so.cache1.1``) written for the tests, entry by entry."""

from __future__ import annotations

import struct

from corral.gateway.templates.ldcache import MAGIC


def cache(entries: list[tuple[str, str]], flags: dict[int, int] | None = None) -> bytes:
    """The cache of ``(soname, file)`` entries, in this order; each an x86-64 library's (flags 0x303)
    but those ``flags`` gives other flags by index (0x3: an i386 library's, which the loader skips)."""
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
    given = flags or {}
    body = b"".join(
        struct.pack("<iIIIQ", given.get(i, 0x303), key, value, 0, 0) for i, (key, value) in enumerate(offsets)
    )
    return header + body + bytes(strings)
