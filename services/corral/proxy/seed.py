"""What a proxy starts from when it shares no directory with the gateway (a runtime whose
``shares_proxy_state`` is False: the swarm driver): the files of its state directory, as secrets.

The gateway's state directory of a session stays the one record of it. :func:`seed_entries` reads
the files a proxy starts from out of it (the CA, the policy, the upstream CA, a hermetic session's
replay, the brokered secrets' bookkeeping, the audit chain so far), cut into parts no larger than a
Swarm secret may be, with a manifest naming each file's parts, size and digest. The runtime gives
them to the proxy as files in one directory (a Swarm secret each, target = the entry's name); at
start the sidecar :func:`plant`\\ s them into its own (tmpfs) state directory, checked against the
manifest, before mitmproxy reads it. Pure: no Docker here (the runtime makes the secrets) and only
the standard library (the egress image carries it).

Bounded both ways: :data:`MAX_SEED_BYTES` in all, :data:`PART_BYTES` a part, :data:`MAX_PARTS`
parts; the manifest is parsed bounded and names only :data:`SEED_FILES` (no path of its own), so a
seed that does not hold what the manifest says is refused whole, with nothing planted.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from corral.errors import SeedRefused

# The names of the entries: secret names and file targets at once (a Swarm secret's name allows
# [a-zA-Z0-9-_.]); the runtime prefixes them with the session to make them unique in the swarm.
MANIFEST: Final = "corral-seed.json"
PART_PREFIX: Final = "corral-seed-"
# Swarm refuses a secret over 500 KiB; every part stays under it.
PART_BYTES: Final = 500 * 1024
# Every secret lives in the managers' raft log: a session's seed stays small beside it.
MAX_SEED_BYTES: Final = 32 << 20
MAX_PARTS: Final = MAX_SEED_BYTES // PART_BYTES + 1
MAX_MANIFEST_BYTES: Final = 64 << 10
SEED_VERSION: Final = 1
# Where the runtime puts the entries in the proxy's container (a Swarm secret's relative target
# lands under /run/secrets); the sidecar plants from here when CORRAL_SEED_DIR names it.
SEED_DIR: Final = "/run/secrets"
SEED_DIR_VARIABLE: Final = "CORRAL_SEED_DIR"

# What a proxy starts from, relative to its state directory (corral.proxy.control's file names and
# the CA's; written out here, not imported, so this module needs no mitmproxy). Never the responses:
# the proxy only appends to them and the gateway mirrors them (corral.gateway.egress.mirror).
SEED_FILES: Final = (
    "ca/mitmproxy-ca.pem",
    "ca/mitmproxy-ca-cert.pem",
    "policy.json",
    "upstream-ca.pem",
    "replay.mitm",
    "secrets.json",
    "audit.jsonl",
)


@dataclass(frozen=True, slots=True)
class SeedFile:
    """One file of the seed as the manifest names it."""

    path: str  # one of SEED_FILES
    size: int
    sha256: str
    parts: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "parts": list(self.parts)}


def seed_entries(state_dir: Path) -> dict[str, bytes]:
    """The entries a proxy starts from, by name (the manifest and the parts), read from the gateway's
    ``state_dir`` of the session; SeedRefused when they would be more than :data:`MAX_SEED_BYTES`.
    A file of :data:`SEED_FILES` that is not there is left out (no upstream CA, no replay)."""
    entries: dict[str, bytes] = {}
    files: list[SeedFile] = []
    total = 0
    for relative in SEED_FILES:
        data = _read_bounded(state_dir / relative, MAX_SEED_BYTES - total)
        if data is None:
            continue
        total += len(data)
        parts: list[str] = []
        for start in range(0, max(len(data), 1), PART_BYTES):
            name = f"{PART_PREFIX}{len(entries)}"
            entries[name] = data[start : start + PART_BYTES]
            parts.append(name)
        files.append(SeedFile(relative, len(data), hashlib.sha256(data).hexdigest(), tuple(parts)))
    manifest = {"version": SEED_VERSION, "files": [f.to_json() for f in files]}
    entries[MANIFEST] = json.dumps(manifest, separators=(",", ":")).encode()
    return entries


def _read_bounded(path: Path, room: int) -> bytes | None:
    """The file's bytes (None: not there); SeedRefused past ``room``."""
    try:
        with path.open("rb") as source:
            data = source.read(room + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SeedRefused(f"cannot read {path.name} of the proxy's state: {exc.strerror or exc}") from None
    if len(data) > room:
        raise SeedRefused(f"the proxy's state is more than {MAX_SEED_BYTES} bytes (at {path.name}): too large to seed")
    return data


def parse_manifest(data: bytes) -> tuple[SeedFile, ...]:
    """The manifest's files, every field checked (pure); SeedRefused naming what is wrong."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise SeedRefused(f"the seed's manifest is more than {MAX_MANIFEST_BYTES} bytes")
    try:
        obj = json.loads(data)
    except ValueError:
        raise SeedRefused("the seed's manifest is not JSON") from None
    if not isinstance(obj, dict) or obj.get("version") != SEED_VERSION or not isinstance(obj.get("files"), list):
        raise SeedRefused(f"the seed's manifest is not version {SEED_VERSION} with a list of files")
    files = tuple(_seed_file(item) for item in obj["files"])
    paths = [f.path for f in files]
    parts = [part for f in files for part in f.parts]
    if len(set(paths)) != len(paths) or len(set(parts)) != len(parts):
        raise SeedRefused("the seed's manifest names a file or a part twice")
    if len(parts) > MAX_PARTS or sum(f.size for f in files) > MAX_SEED_BYTES:
        raise SeedRefused(f"the seed's manifest names more than {MAX_SEED_BYTES} bytes")
    return files


def _seed_file(item: object) -> SeedFile:
    if not isinstance(item, dict):
        raise SeedRefused("each file of the seed's manifest is an object")
    path, size, digest, parts = item.get("path"), item.get("size"), item.get("sha256"), item.get("parts")
    if path not in SEED_FILES:
        raise SeedRefused(f"the seed's manifest names a file no proxy starts from: {str(path)[:80]!r}")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_SEED_BYTES:
        raise SeedRefused(f"the seed's manifest gives {path} no size")
    if not isinstance(digest, str) or len(digest) != 64:
        raise SeedRefused(f"the seed's manifest gives {path} no sha256")
    if not isinstance(parts, list) or not parts or not all(_part_name(p) for p in parts):
        raise SeedRefused(f"the seed's manifest gives {path} no parts (each {PART_PREFIX}<n>)")
    return SeedFile(str(path), size, digest, tuple(str(p) for p in parts))


def _part_name(value: object) -> bool:
    return isinstance(value, str) and value.startswith(PART_PREFIX) and value[len(PART_PREFIX) :].isdigit()


def plant(secrets_dir: Path, state_dir: Path) -> list[str]:
    """The seed in ``secrets_dir`` written into ``state_dir`` (0700 directories, 0600 files): what the
    sidecar runs at start when its state is empty. Returns the paths planted. Every file is read and
    checked (size, digest) before the first is written: a seed that is not whole plants nothing
    (SeedRefused). No manifest: nothing to plant (a runtime that shares the directory)."""
    manifest = secrets_dir / MANIFEST
    if not manifest.exists():
        return []
    contents = {f.path: _assemble(secrets_dir, f) for f in parse_manifest(_read_part(manifest, MAX_MANIFEST_BYTES))}
    return write_state(state_dir, contents)


def _assemble(secrets_dir: Path, seed_file: SeedFile) -> bytes:
    data = b"".join(_read_part(secrets_dir / part, PART_BYTES) for part in seed_file.parts)
    if len(data) != seed_file.size or hashlib.sha256(data).hexdigest() != seed_file.sha256:
        raise SeedRefused(f"the seed of {seed_file.path} is not whole (its size or digest differs)")
    return data


def _read_part(path: Path, limit: int) -> bytes:
    try:
        with path.open("rb") as source:
            data = source.read(limit + 1)
    except OSError as exc:
        raise SeedRefused(f"cannot read the seed's {path.name}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise SeedRefused(f"the seed's {path.name} is more than {limit} bytes")
    return data


def write_state(state_dir: Path, contents: Mapping[str, bytes]) -> list[str]:
    """Each file into ``state_dir`` (made 0700), 0600, created afresh (an existing file is replaced,
    a symlink in the way is not followed)."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for relative, data in contents.items():
        target = state_dir / relative
        target.parent.mkdir(mode=0o700, exist_ok=True)
        target.unlink(missing_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    return list(contents)


__all__ = [
    "MANIFEST",
    "MAX_SEED_BYTES",
    "PART_BYTES",
    "PART_PREFIX",
    "SEED_DIR",
    "SEED_DIR_VARIABLE",
    "SEED_FILES",
    "SeedFile",
    "SeedRefused",
    "parse_manifest",
    "plant",
    "seed_entries",
    "write_state",
]
