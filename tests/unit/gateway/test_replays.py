"""Uploaded replay responses: checked, cut to whole flows, kept per owner, pruned."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from corral.errors import ReplayNotFound
from corral.gateway.replays import ReplayUploads

FLOW = b"25:2:id;3:abc;4:type;4:http;}"


def _upload(uploads: ReplayUploads, data: bytes, owner: str = "key-a") -> tuple[str, object]:
    upload_id, part = uploads.begin()
    part.write_bytes(data)
    return upload_id, uploads.finish(upload_id, part, owner)


def test_an_upload_is_kept_whole_flows_only_and_for_its_owner_alone(tmp_path: Path) -> None:
    uploads = ReplayUploads(tmp_path, 1 << 20)
    upload_id, checked = _upload(uploads, FLOW * 2 + b"99:{torn")
    assert (checked.flows, checked.torn) == (2, True)  # type: ignore[attr-defined]
    path = uploads.path_for(upload_id, "key-a")
    assert path.read_bytes() == FLOW * 2
    with pytest.raises(ReplayNotFound):
        uploads.path_for(upload_id, "key-b")
    with pytest.raises(ReplayNotFound):
        uploads.delete(upload_id, "key-b")
    uploads.delete(upload_id, "key-a")
    with pytest.raises(ReplayNotFound):
        uploads.path_for(upload_id, "key-a")


@pytest.mark.parametrize("bad_id", ["../../etc/passwd", "rsp_", "rsp_../../../../x", "ses_0123456789abcdef"])
def test_ids_are_checked_before_any_path_is_made(tmp_path: Path, bad_id: str) -> None:
    with pytest.raises(ValueError, match="not a replay-responses id"):
        ReplayUploads(tmp_path, 1 << 20).path_for(bad_id, "key-a")


def test_foreign_data_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    uploads = ReplayUploads(tmp_path, 1 << 20)
    with pytest.raises(ValueError, match="not a mitmproxy flow file"):
        _upload(uploads, b"PK\x03\x04 some zip")
    assert [p.name for p in tmp_path.iterdir()] == []


def test_old_uploads_are_pruned(tmp_path: Path) -> None:
    uploads = ReplayUploads(tmp_path, 1 << 20)
    old_id, _ = _upload(uploads, FLOW)
    new_id, _ = _upload(uploads, FLOW)
    stale = time.time() - 7200
    os.utime(uploads.path_for(old_id, "key-a"), (stale, stale))
    assert uploads.prune(3600) == 1
    assert uploads.path_for(new_id, "key-a").exists()
    with pytest.raises(ReplayNotFound):
        uploads.path_for(old_id, "key-a")
