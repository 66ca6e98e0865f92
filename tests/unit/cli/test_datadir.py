"""`corral up`'s data dir: made, and a shared mount (compose binds it rshared for workspace volumes),
undone by `corral down`; against the real mount table (this machine's / is a private mount)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.cli import datadir
from corral.errors import CorralError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="binds a mount: root only")


@needs_root
def test_a_data_dir_on_a_private_mount_is_bound_shared_and_unbound_again(tmp_path: Path) -> None:
    if datadir.propagation(tmp_path).startswith("shared"):
        pytest.skip("the tests' tmp dir is on a shared mount here: nothing to bind")
    data = tmp_path / "data"
    try:
        assert datadir.prepare(data) == [f"made {data}", f"made {data} a shared mount (bound onto itself, rshared)"]
        assert data.stat().st_mode & 0o777 == 0o700
        assert datadir.propagation(data) == "shared"
        assert datadir.prepare(data) == []  # once is enough
        assert datadir.release(data) == [f"unbound {data}"]
        assert not datadir.propagation(data).startswith("shared")
        assert datadir.release(data) == []  # nothing of ours bound there any more
    finally:
        datadir.release(data)


def test_a_data_dir_it_did_not_bind_is_never_unmounted(tmp_path: Path) -> None:
    assert datadir.release(tmp_path) == []


def test_without_root_it_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if datadir.propagation(tmp_path).startswith("shared"):
        pytest.skip("the tests' tmp dir is on a shared mount here: nothing to refuse")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(CorralError, match=r"mount --bind .* && mount --make-rshared"):
        datadir.prepare(tmp_path)
