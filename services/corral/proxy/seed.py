"""What a proxy starts from when it shares no directory with its gateway (the swarm driver): the
gateway's state directory read into named entries (CA, policy, upstream CA, replay), handed to the
proxy as files (Swarm secrets), and planted by the sidecar into its own, empty, state directory.

The driver's minimal copy for issue 30 (the ``state`` part owns this module and replaces it)."""

from __future__ import annotations

import os
from pathlib import Path

from corral.errors import SeedTooLarge
from corral.proxy.control import POLICY_FILE, REPLAY_FILE

# corral.proxy.ca's file names, spelt here: the egress image carries no ca module (the gateway makes the CA).
KEY_AND_CERT = "mitmproxy-ca.pem"
CERT_ONLY = "mitmproxy-ca-cert.pem"

# Relative path in the state directory -> the flat name it travels under (a Swarm secret's name
# allows no slash). Only these: nothing else of the state directory is a proxy's to start from.
SEEDED: dict[str, str] = {
    f"ca/{KEY_AND_CERT}": "ca-key-and-cert.pem",
    f"ca/{CERT_ONLY}": "ca-cert.pem",
    POLICY_FILE: "policy.json",
    "upstream-ca.pem": "upstream-ca.pem",
    REPLAY_FILE: "replay.mitm",
}
# A Swarm secret holds at most 500 KiB.
MAX_ENTRY_BYTES = 500 * 1024


def seed_entries(state_dir: Path) -> dict[str, bytes]:
    """Flat name -> content of every seeded file present in ``state_dir`` (each bounded)."""
    out: dict[str, bytes] = {}
    for relative, flat in SEEDED.items():
        path = state_dir / relative
        if not path.is_file() or path.is_symlink():
            continue
        size = path.stat().st_size
        if size > MAX_ENTRY_BYTES:
            raise SeedTooLarge(f"{relative} is {size} bytes; a proxy's seed file holds at most {MAX_ENTRY_BYTES}")
        with path.open("rb") as handle:
            out[flat] = handle.read(MAX_ENTRY_BYTES + 1)[:MAX_ENTRY_BYTES]
    return out


def plant(secrets_dir: Path, state_dir: Path) -> list[str]:
    """The seeded files found in ``secrets_dir`` copied into ``state_dir`` (made 0700), each 0600;
    returns what was planted. Nothing is overwritten: a state already there is the proxy's own."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (state_dir / "ca").mkdir(mode=0o700, exist_ok=True)
    planted = []
    for relative, flat in SEEDED.items():
        source, target = secrets_dir / flat, state_dir / relative
        if not source.is_file() or target.exists():
            continue
        with source.open("rb") as handle:
            data = handle.read(MAX_ENTRY_BYTES + 1)[:MAX_ENTRY_BYTES]
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        planted.append(relative)
    return planted
