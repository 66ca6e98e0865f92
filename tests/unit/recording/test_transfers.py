"""Files moved over HTTP on replay: an upload skipped, a download re-checked as the agent sees it."""

from __future__ import annotations

from typing import Any

from corral.recording.transfers import is_transfer, replay_transfer


def _download(step: dict[str, Any], result: dict[str, Any], error: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"native": [{"type": "file_download", **step}], "ok": error is None}
    event["reply"] = {"ok": error is None, "result": result}
    if error is not None:
        event["error"] = {"code": error, "message": "no"}
    return event


class Sandbox:
    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies, self.sent = list(replies), []  # type: list[dict[str, Any]], list[dict[str, Any]]

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(request["action"])
        return self.replies.pop(0)


FILE = {"ok": True, "result": {"type": "file"}}


def test_a_download_cut_short_when_recorded_is_checked_by_its_type_only() -> None:
    cut = _download({"path": "f"}, {"type": "file", "size": 3, "sha256": "c" * 64, "complete": False})
    sandbox = Sandbox(FILE)
    verdict = replay_transfer(cut, sandbox)
    assert verdict.status == "passed" and sandbox.sent == [{"type": "file_stat", "path": "f"}]  # no sha256sum
    assert verdict.reason.startswith("type matches: file, recorded file")


def test_a_name_that_is_not_utf8_is_stat_by_its_bytes_and_never_run_through_a_command() -> None:
    raw = _download({"path_base64": "Y2Fm6Q=="}, {"type": "file", "size": 3, "sha256": "c" * 64, "complete": True})
    sandbox = Sandbox(FILE)
    assert replay_transfer(raw, sandbox).status == "passed"
    assert sandbox.sent == [{"type": "file_stat", "path_base64": "Y2Fm6Q=="}]


def test_a_download_that_failed_must_fail_alike_and_a_type_change_diverges() -> None:
    failed = _download({"path": "x"}, {}, error="permission_denied")
    denied = {"ok": False, "error": {"code": "permission_denied"}}
    assert replay_transfer(failed, Sandbox(denied)).status == "passed"
    other = replay_transfer(failed, Sandbox({"ok": False, "error": {"code": "no_such_file"}}))
    assert other.status == "diverged" and other.reason.startswith("outcome differs: failed with no_such_file")
    now_there = replay_transfer(failed, Sandbox(FILE))
    assert now_there.status == "diverged" and "succeeded" in now_there.reason
    folder = _download({"path": "d"}, {"type": "directory", "size": 10240, "sha256": "d" * 64, "complete": True})
    assert replay_transfer(folder, Sandbox(FILE)).status == "diverged"


def test_only_uploads_and_downloads_are_transfers() -> None:
    assert is_transfer({"native": [{"type": "file_upload", "path": "a"}]})
    assert not is_transfer({"native": [{"type": "file_write", "path": "a"}]})
