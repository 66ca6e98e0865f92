"""Everything the gateway writes in its data dir is its own (issue 10): directories 0700 and files
0600 from their creation whatever the umask, and no session record holds a proxy's token."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import TypeAdapter

from corral.gateway.egress import Egress, EgressManager
from corral.gateway.egress.pairs import TOKEN_KEY_FILE
from corral.gateway.recording import RecordingManager
from corral.gateway.replays import ReplayUploads
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore, write_private

from .controller_fake import SECRET, proving

SID = "ses_0123456789abcdef"
FLOW = b"25:2:id;3:abc;4:type;4:http;}"


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The widest umask: every mode below is the one asked for at creation, not the umask's doing."""
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")]}


def test_session_records_are_0600_in_a_0700_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = SessionStore(data)
    store.save(SID, {"id": SID})
    assert _modes(data) == {".": 0o700, "sessions": 0o700, f"sessions/{SID}.json": 0o600}
    assert store.load_all(dict) == [{"id": SID}]


def test_an_older_wider_data_dir_is_narrowed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sessions").mkdir(parents=True, mode=0o755)
    data.chmod(0o755)
    SessionStore(data)
    assert _mode(data) == 0o700 and _mode(data / "sessions") == 0o700


def test_an_atomic_write_is_private_from_the_start_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    target.write_text("old")
    target.chmod(0o644)
    write_private(target, "new")
    assert target.read_text() == "new" and _mode(target) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


async def test_recordings_are_private(tmp_path: Path) -> None:
    def controller(request: httpx.Request) -> httpx.Response:
        event = {"seq": 1, "request": {"id": "x"}, "ok": True, "frame_webp": "UklGRg=="}
        events = [event] if request.url.params.get("after") == "0" else []
        return httpx.Response(200, json={"events": events, "oldest": 1, "last": 1, "boot": "b"})

    manager = RecordingManager(tmp_path / "recordings")
    client = httpx.AsyncClient(transport=httpx.MockTransport(proving(controller)))
    manager.start(SID, "http://sandbox", None, client, {"viewport": {}}, "key-a", secret=SECRET)
    recorder = manager._live[SID]
    assert recorder._task is not None
    recorder._task.cancel()
    await recorder.fetch(0)
    responses = tmp_path / "responses.mitm"
    responses.write_bytes(FLOW)
    await manager.stop(SID, "deleted", drain_s=0.1)
    manager.attach_responses(SID, responses)
    modes = _modes(tmp_path / "recordings")
    assert modes == {
        ".": 0o700,
        SID: 0o700,
        f"{SID}/frames": 0o700,
        f"{SID}/frames/000001.webp": 0o600,
        f"{SID}/manifest.json": 0o600,
        f"{SID}/.owner": 0o600,
        f"{SID}/events.jsonl": 0o600,
        f"{SID}/responses.mitm": 0o600,
    }


def test_uploads_are_private(tmp_path: Path) -> None:
    uploads = ReplayUploads(tmp_path / "replay-responses", 1 << 20)
    upload_id, part = uploads.begin()
    assert _mode(part) == 0o600
    with part.open("wb") as out:  # as the app writes it
        out.write(FLOW)
    uploads.finish(upload_id, part, "key-a")
    assert set(_modes(tmp_path / "replay-responses").values()) == {0o700, 0o600}
    assert _mode(tmp_path / "replay-responses") == 0o700


def _egress(tmp_path: Path, **settings: object) -> EgressManager:
    return EgressManager(GatewaySettings(data_dir=tmp_path, **settings), runtime=None)  # type: ignore[arg-type]


def test_proxy_tokens_are_derived_never_stored(tmp_path: Path) -> None:
    manager = _egress(tmp_path)
    token = manager.token(SID)
    assert token == manager.token(SID) != manager.token("ses_fedcba9876543210") and len(token) >= 40
    assert _mode(tmp_path / TOKEN_KEY_FILE) == 0o600 and _mode(tmp_path) == 0o700
    # A restarted gateway derives the same token from the kept key; another data dir, another token.
    assert _egress(tmp_path).token(SID) == token
    assert _egress(tmp_path / "other").token(SID) != token
    egress = Egress(SID, "net", "10.0.0.0/28", "10.0.0.1", "id", "name", "10.0.0.2", str(tmp_path))
    as_kept = TypeAdapter(Egress)  # how the session record (SessionRecord) reads and writes it
    record = as_kept.dump_python(egress, mode="json")
    assert token not in json.dumps(record) and "gateway_token" not in record
    # A record written by an older gateway (with a token in it) still loads; the token is not kept.
    assert "gateway_token" not in as_kept.dump_python(as_kept.validate_python({**record, "gateway_token": "old"}))
    assert as_kept.validate_python({**record, "interface": "br-old"}) == egress  # from before the runtime seam
