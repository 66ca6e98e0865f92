"""An upgrade from a gateway that named keys by an unsalted SHA-256 prefix: what that gateway wrote (a
live session's record, an ended recording, an audit archive) is still found by its owner's key, and by no
other, once the new gateway has started over the same data dir and the same sandboxes."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from corral.gateway import auth
from corral.gateway.app import create_app
from corral.gateway.recording import OWNER_FILE
from corral.gateway.store import private_dir, write_json, write_private
from corral.recording.bundle import EVENTS_FILE, MANIFEST_FILE

from .conftest import KEY, OTHER_KEY, LoopbackRuntime, settings_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

ENDED = "ses_old000001"


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _older_gateways_leftovers(data_dir: Path, old_id: str) -> None:
    """An ended session's recording and audit archive as the older gateway left them (this gateway has
    no egress control, so the archive is only renamed: tests/unit/gateway/test_keyids.py reads it)."""
    recording = private_dir(data_dir / "recordings" / ENDED)
    write_json(recording / MANIFEST_FILE, {"format": "corral-recording", "session": ENDED, "ended_at": 2.0})
    write_private(recording / EVENTS_FILE, json.dumps({"seq": 1, "time": 1.0, "event": "action"}) + "\n")
    write_private(recording / OWNER_FILE, old_id)
    audit = private_dir(data_dir / "egress" / ENDED)
    write_json(audit / "session.json", {"session": ENDED, "owner": old_id, "created_at": 1.0, "ended_at": 2.0})


def test_an_older_gateways_records_are_still_found_by_their_owners_key_after_an_upgrade(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, record=True, pool_size=0)
    runtime = LoopbackRuntime()  # the sandboxes outlive the gateway, as Docker's do
    with TestClient(create_app(settings, runtime=runtime)) as before:
        made = before.post("/v1/sessions", json={}, headers=_bearer(KEY))
        assert made.status_code == 201, made.text
        live = made.json()["id"]
    # What the older gateway would have written: the same records, naming the key by its old id.
    old_id = auth.legacy_key_id(KEY)
    record_path = tmp_path / "sessions" / f"{live}.json"
    record = json.loads(record_path.read_text())
    write_json(record_path, {**record, "owner": old_id})
    write_private(tmp_path / "recordings" / live / OWNER_FILE, old_id)
    _older_gateways_leftovers(tmp_path, old_id)

    with TestClient(create_app(settings, runtime=runtime)) as after:
        assert after.get(f"/v1/sessions/{live}", headers=_bearer(KEY)).status_code == 200
        assert [s["id"] for s in after.get("/v1/sessions", headers=_bearer(KEY)).json()] == [live]
        assert {r["session"] for r in after.get("/v1/recordings", headers=_bearer(KEY)).json()} == {live, ENDED}
        assert after.get(f"/v1/sessions/{ENDED}/recording", headers=_bearer(KEY)).status_code == 200
        # Another key of the same gateway finds none of it.
        assert after.get(f"/v1/sessions/{live}", headers=_bearer(OTHER_KEY)).status_code == 403
        assert after.get("/v1/recordings", headers=_bearer(OTHER_KEY)).json() == []
        assert after.get(f"/v1/sessions/{ENDED}/recording", headers=_bearer(OTHER_KEY)).status_code == 403
    # The records now name the key by the id no one can compute without the gateway's secret.
    new_id = auth.key_id(KEY, auth.load_key_id_key(tmp_path))
    assert json.loads(record_path.read_text())["owner"] == new_id
    assert json.loads((tmp_path / "egress" / ENDED / "session.json").read_text())["owner"] == new_id
