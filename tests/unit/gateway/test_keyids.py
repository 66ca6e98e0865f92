"""Records an older gateway wrote under its key ids still belong to their key after an upgrade."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from corral.gateway import auth, keyids
from corral.gateway.store import private_dir, write_json, write_private

KEY = "owner-key-Qm3Zr8Tx5Vw2Ny7Kb4Hc9Pd6Lf"
GONE = "key-0123456789ab"  # the id of a key this gateway no longer holds


def _older_gateways_data(data_dir: Path, old: str) -> None:
    for where in ("sessions", "egress/ses_a", "recordings/ses_a", "replay-responses"):
        private_dir(data_dir / where)
    write_json(
        data_dir / "sessions" / "ses_a.json",
        {"id": "ses_a", "owner": old, "links": {"lnk_1": {"id": "lnk_1", "created_by": old}}},
    )
    write_json(data_dir / "sessions" / "ses_b.json", {"id": "ses_b", "owner": GONE, "links": {}})
    write_json(data_dir / "egress" / "ses_a" / "session.json", {"session": "ses_a", "owner": old})
    write_private(data_dir / "recordings" / "ses_a" / ".owner", old)
    write_private(data_dir / "replay-responses" / "up_1.owner", old)


def test_an_upgrade_renames_the_owners_of_its_keys_records_once(tmp_path: Path) -> None:
    old = auth.legacy_key_id(KEY)
    _older_gateways_data(tmp_path, old)
    ring = auth.KeyRing([KEY], auth.load_key_id_key(tmp_path))
    new = ring.check(KEY)
    assert new is not None and new != old
    assert keyids.adopt(tmp_path, ring.renamed) == 4
    record = json.loads((tmp_path / "sessions" / "ses_a.json").read_text())
    assert record["owner"] == new and record["links"]["lnk_1"]["created_by"] == new
    assert json.loads((tmp_path / "egress" / "ses_a" / "session.json").read_text())["owner"] == new
    assert (tmp_path / "recordings" / "ses_a" / ".owner").read_text() == new
    assert (tmp_path / "replay-responses" / "up_1.owner").read_text() == new
    # Another key's records are left as they were; the files stay the owner's only; a second run changes nothing.
    assert json.loads((tmp_path / "sessions" / "ses_b.json").read_text())["owner"] == GONE
    assert stat.S_IMODE((tmp_path / "sessions" / "ses_a.json").stat().st_mode) == 0o600
    assert keyids.adopt(tmp_path, ring.renamed) == 0
