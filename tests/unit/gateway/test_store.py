"""The data dir's one atomic write and the session records kept with it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from corral.gateway.store import SessionStore, private_file, write_json


def test_write_json_replaces_whole_and_private(tmp_path: Path) -> None:
    target = tmp_path / "value.json"
    write_json(target, {"a": 1})
    write_json(target, {"b": [1, 2]}, indent=2)
    assert json.loads(target.read_text()) == {"b": [1, 2]} and "\n  " in target.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["value.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "value.json"
    write_json(target, {"kept": True})
    with pytest.raises(RuntimeError), private_file(target, None) as out:
        out.write(b"half")
        raise RuntimeError("the disk filled up")
    assert json.loads(target.read_text()) == {"kept": True}
    assert [p.name for p in tmp_path.iterdir()] == ["value.json"]


def test_records_are_saved_loaded_and_deleted(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    store.save("ses_b", {"id": "ses_b"})
    store.save("ses_a", {"id": "ses_a"})
    (tmp_path / "sessions" / "ses_torn.json").write_text('{"id": ')
    (tmp_path / "sessions" / "ses_list.json").write_text("[]")
    assert store.load_all(dict) == [{"id": "ses_a"}, {"id": "ses_b"}]  # the torn one and the list are not
    assert sorted(p.name for p in (tmp_path / "sessions").glob("*.unreadable")) == [
        "ses_list.json.unreadable",
        "ses_torn.json.unreadable",
    ]  # set aside, kept for a look, not read again
    store.delete("ses_a")
    store.delete("ses_never")
    assert store.load_all(dict) == [{"id": "ses_b"}]
    assert stat.S_IMODE((tmp_path / "sessions").stat().st_mode) == 0o700
