"""A download's file opened for the gateway (corral.sandbox.tools.downloadfiles) against a real folder
standing in for ~/Downloads: a symbolic link, another owner's file, a hard link, a missing file and an
unfinished download are refused; a good file is sent up to the bytes its record counted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.contracts.downloads import DOWNLOADS_DIR
from corral.errors import ActionError, ErrorCode
from corral.protocol.downloads import Download, DownloadCause
from corral.sandbox.tools.downloadfiles import body, open_download


class FolderFs:
    """Only ``open``, as the launcher's: ~/Downloads mapped onto ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        assert path.startswith(DOWNLOADS_DIR + "/")
        return os.open(self.root / path[len(DOWNLOADS_DIR) + 1 :], flags, mode)


def record(name: str = "a.bin", size: int = 5, state: str = "completed") -> Download:
    return Download(
        id="guid-1",
        name=name,
        path=f"{DOWNLOADS_DIR}/{name}",
        url="https://x.test/a.bin",
        mime_type="application/octet-stream",
        state=state,  # type: ignore[arg-type]
        size=size,
        started_at=1.0,
        cause=DownloadCause(kind="browser"),
    )


async def _refused(fs: FolderFs, download: Download, code: ErrorCode, uid: int | None = None) -> str:
    with pytest.raises(ActionError) as refused:
        await open_download(fs, download, os.getuid() if uid is None else uid)  # type: ignore[arg-type]
    assert refused.value.code == code and refused.value.field == "download_id"
    return refused.value.message


async def test_a_good_file_is_sent_up_to_its_record_s_size(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"0123456789")  # the agent appended to it since
    opened = await open_download(FolderFs(tmp_path), record(size=5), os.getuid())  # type: ignore[arg-type]
    assert opened.length == 5
    sent = b"".join([chunk async for chunk in body(opened)])
    assert sent == b"01234"


async def test_a_symbolic_link_in_its_place_is_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"the controller's secret")
    (tmp_path / "a.bin").symlink_to(secret)
    assert "symbolic link" in await _refused(FolderFs(tmp_path), record(), ErrorCode.DOWNLOAD_UNAVAILABLE)


async def test_another_owner_s_file_or_a_hard_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"01234")
    fs = FolderFs(tmp_path)
    assert "did not save" in await _refused(fs, record(), ErrorCode.DOWNLOAD_UNAVAILABLE, uid=os.getuid() + 1)
    os.link(tmp_path / "a.bin", tmp_path / "elsewhere")
    assert "did not save" in await _refused(fs, record(), ErrorCode.DOWNLOAD_UNAVAILABLE)


async def test_a_directory_or_a_fifo_in_its_place_is_refused_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "a.bin").mkdir()
    await _refused(FolderFs(tmp_path), record(), ErrorCode.DOWNLOAD_UNAVAILABLE)
    os.mkfifo(tmp_path / "f.bin")
    await _refused(FolderFs(tmp_path), record("f.bin"), ErrorCode.DOWNLOAD_UNAVAILABLE)


async def test_a_missing_file_and_an_unfinished_download(tmp_path: Path) -> None:
    fs = FolderFs(tmp_path)
    assert "gone" in await _refused(fs, record(), ErrorCode.NO_SUCH_DOWNLOAD)
    (tmp_path / "a.bin").write_bytes(b"01234")
    assert "in progress" in await _refused(fs, record(state="in_progress"), ErrorCode.DOWNLOAD_UNAVAILABLE)
    capped = record(state="capped").model_copy(update={"error": "over the cap"})
    assert "over the cap" in await _refused(fs, capped, ErrorCode.DOWNLOAD_UNAVAILABLE)
