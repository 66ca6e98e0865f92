"""The gateway's egress archive: state directories, session metadata, listing and retention."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from corral.gateway.egress import EgressManager
from corral.gateway.settings import GatewaySettings


def _manager(tmp_path: Path) -> EgressManager:
    return EgressManager(GatewaySettings(data_dir=tmp_path), runtime=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["../etc", "ses_../x", "ses_a/b", "abc", "ses_"])
def test_state_dirs_are_only_for_session_ids(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        _manager(tmp_path).state_dir(bad)


def test_logs_are_listed_per_key_and_pruned_after_retention(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    for sid, owner in (("ses_a1", "k1"), ("ses_b2", "k2"), ("ses_c3", "k1")):
        manager.state_dir(sid).mkdir(parents=True)
        manager.write_meta(sid, owner=owner, created_at=time.time(), ended_at=None)
    (manager.state_dir("ses_a1") / "audit.jsonl").write_text('{"seq":1}\n{"seq":2}\n')
    manager.write_meta("ses_c3", ended_at=time.time() - 10 * 86400)
    listed = {item["session"]: item for item in manager.logs("k1")}
    assert set(listed) == {"ses_a1", "ses_c3"}
    assert (listed["ses_a1"]["records"], listed["ses_a1"]["state"]) == (2, "live")
    assert listed["ses_c3"]["state"] == "ended"
    assert manager.prune(retention_s=86400, live={"ses_a1"}) == 1
    assert not manager.state_dir("ses_c3").exists() and manager.state_dir("ses_a1").exists()
    assert manager.meta("ses_zz") is None
