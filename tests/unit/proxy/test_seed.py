"""A proxy's seed (corral.proxy.seed): the gateway's state of a session cut into secrets, planted
back whole into the proxy's own state directory, or not at all."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from corral.errors import SeedRefused
from corral.proxy import seed
from corral.proxy.sidecar import plant_seed


def _state(root: Path, replay: bytes = b"") -> Path:
    state = root / "state"
    (state / "ca").mkdir(parents=True)
    (state / "ca" / "mitmproxy-ca.pem").write_bytes(b"KEY AND CERT")
    (state / "ca" / "mitmproxy-ca-cert.pem").write_bytes(b"CERT")
    (state / "policy.json").write_bytes(b'{"allow":["a.test"],"mode":"enforce","generation":0}')
    if replay:
        (state / "replay.mitm").write_bytes(replay)
    (state / "responses.mitm").write_bytes(b"never seeded")
    (state / "unrelated.txt").write_bytes(b"never seeded either")
    return state


def _as_secrets(entries: dict[str, bytes], directory: Path) -> Path:
    directory.mkdir()
    for name, data in entries.items():
        (directory / name).write_bytes(data)
    return directory


def test_seed_entries_cut_large_files_into_parts_under_swarms_limit_and_plant_gives_them_back(tmp_path: Path) -> None:
    replay = os.urandom(seed.PART_BYTES * 2 + 17)
    entries = seed.seed_entries(_state(tmp_path, replay))
    assert all(len(data) <= seed.PART_BYTES for data in entries.values())
    assert all(len(name) <= 64 and name.replace("-", "").replace(".", "").isalnum() for name in entries)
    manifest = {f.path: f for f in seed.parse_manifest(entries[seed.MANIFEST])}
    assert set(manifest) == {"ca/mitmproxy-ca.pem", "ca/mitmproxy-ca-cert.pem", "policy.json", "replay.mitm"}
    assert len(manifest["replay.mitm"].parts) == 3

    planted_dir = tmp_path / "proxy" / "state"
    planted = seed.plant(_as_secrets(entries, tmp_path / "secrets"), planted_dir)

    assert sorted(planted) == sorted(manifest)
    assert (planted_dir / "replay.mitm").read_bytes() == replay
    assert (planted_dir / "ca" / "mitmproxy-ca.pem").read_bytes() == b"KEY AND CERT"
    assert not (planted_dir / "responses.mitm").exists()
    for path in [planted_dir, planted_dir / "ca"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((planted_dir / "policy.json").stat().st_mode) == 0o600


def test_an_empty_file_is_seeded_as_one_empty_part(tmp_path: Path) -> None:
    state = _state(tmp_path)
    (state / "audit.jsonl").write_bytes(b"")
    entries = seed.seed_entries(state)
    (audit,) = [f for f in seed.parse_manifest(entries[seed.MANIFEST]) if f.path == "audit.jsonl"]
    assert entries[audit.parts[0]] == b""
    seed.plant(_as_secrets(entries, tmp_path / "secrets"), tmp_path / "planted")
    assert (tmp_path / "planted" / "audit.jsonl").read_bytes() == b""


def test_a_state_too_large_to_seed_is_refused_naming_the_file(tmp_path: Path) -> None:
    state = _state(tmp_path)
    with (state / "replay.mitm").open("wb") as out:
        out.truncate(seed.MAX_SEED_BYTES + 1)
    with pytest.raises(SeedRefused, match=r"too large to seed.*replay\.mitm|replay\.mitm.*too large"):
        seed.seed_entries(state)


def test_a_part_changed_in_transit_plants_nothing(tmp_path: Path) -> None:
    entries = seed.seed_entries(_state(tmp_path, b"recorded answers"))
    (replay,) = [f for f in seed.parse_manifest(entries[seed.MANIFEST]) if f.path == "replay.mitm"]
    entries[replay.parts[0]] = b"recorded answerZ"
    with pytest.raises(SeedRefused, match=r"replay\.mitm is not whole"):
        seed.plant(_as_secrets(entries, tmp_path / "secrets"), tmp_path / "planted")
    assert not (tmp_path / "planted").exists()  # nothing written, not even the CA read before it


def test_a_missing_part_plants_nothing(tmp_path: Path) -> None:
    entries = seed.seed_entries(_state(tmp_path))
    (policy,) = [f for f in seed.parse_manifest(entries[seed.MANIFEST]) if f.path == "policy.json"]
    del entries[policy.parts[0]]
    with pytest.raises(SeedRefused, match="cannot read the seed's corral-seed-"):
        seed.plant(_as_secrets(entries, tmp_path / "secrets"), tmp_path / "planted")


def _manifest(files: list[dict[str, object]]) -> bytes:
    return json.dumps({"version": seed.SEED_VERSION, "files": files}).encode()


@pytest.mark.parametrize(
    ("manifest", "problem"),
    [
        (b"not json", "not JSON"),
        (b"[]", "version"),
        (json.dumps({"version": 99, "files": []}).encode(), "version"),
        (b" " * (seed.MAX_MANIFEST_BYTES + 1), "more than"),
        (
            _manifest([{"path": "../../etc/passwd", "size": 1, "sha256": "0" * 64, "parts": ["corral-seed-0"]}]),
            "no proxy",
        ),
        (_manifest([{"path": "ca", "size": 1, "sha256": "0" * 64, "parts": ["corral-seed-0"]}]), "no proxy starts"),
        (_manifest([{"path": "policy.json", "size": -1, "sha256": "0" * 64, "parts": ["corral-seed-0"]}]), "no size"),
        (_manifest([{"path": "policy.json", "size": 1, "sha256": "x", "parts": ["corral-seed-0"]}]), "no sha256"),
        (_manifest([{"path": "policy.json", "size": 1, "sha256": "0" * 64, "parts": ["../x"]}]), "no parts"),
        (_manifest([{"path": "policy.json", "size": 1, "sha256": "0" * 64, "parts": []}]), "no parts"),
        (
            _manifest(
                [
                    {"path": "policy.json", "size": 1, "sha256": "0" * 64, "parts": ["corral-seed-0"]},
                    {"path": "audit.jsonl", "size": 1, "sha256": "0" * 64, "parts": ["corral-seed-0"]},
                ]
            ),
            "twice",
        ),
        (
            _manifest(
                [
                    {
                        "path": "policy.json",
                        "size": seed.MAX_SEED_BYTES,
                        "sha256": "0" * 64,
                        "parts": ["corral-seed-0"],
                    },
                    {"path": "audit.jsonl", "size": 1, "sha256": "0" * 64, "parts": ["corral-seed-1"]},
                ]
            ),
            "more than",
        ),
    ],
)
def test_a_manifest_that_is_not_one_is_refused_with_what_is_wrong(manifest: bytes, problem: str) -> None:
    with pytest.raises(SeedRefused, match=problem):
        seed.parse_manifest(manifest)


def test_plant_does_not_follow_a_symlink_placed_in_the_state(tmp_path: Path) -> None:
    entries = seed.seed_entries(_state(tmp_path))
    planted = tmp_path / "planted"
    planted.mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"kept")
    (planted / "policy.json").symlink_to(outside)
    seed.plant(_as_secrets(entries, tmp_path / "secrets"), planted)
    assert outside.read_bytes() == b"kept"
    assert not (planted / "policy.json").is_symlink()


def test_no_manifest_plants_nothing(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    assert seed.plant(tmp_path / "secrets", tmp_path / "planted") == []
    assert not (tmp_path / "planted").exists()


def test_the_sidecar_plants_only_into_an_empty_state_and_only_when_seeded(tmp_path: Path) -> None:
    entries = seed.seed_entries(_state(tmp_path))
    secrets = _as_secrets(entries, tmp_path / "secrets")
    own = tmp_path / "tmpfs" / "state"
    assert plant_seed({"CORRAL_STATE_DIR": str(own)}) == []  # no seed: the docker driver's bind mount
    env = {"CORRAL_STATE_DIR": str(own), seed.SEED_DIR_VARIABLE: str(secrets)}
    assert "policy.json" in plant_seed(env)
    (own / "policy.json").write_bytes(b"changed by the proxy since")
    assert plant_seed(env) == []  # a state there already is the proxy's own: never overwritten
    assert (own / "policy.json").read_bytes() == b"changed by the proxy since"
    digest = hashlib.sha256((own / "ca" / "mitmproxy-ca.pem").read_bytes()).hexdigest()
    assert digest == hashlib.sha256(b"KEY AND CERT").hexdigest()
