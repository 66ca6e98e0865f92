"""Judging a command or file step by its result: checks, pid mapping, uploads that cannot be resent."""

from __future__ import annotations

from typing import Any

from corral.recording.judge import Check, PidMap, action_type, cut_upload, judge, judged_by_result
from corral.recording.redact import redact


def _event(act: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return {"request": {"id": 1, "action": act}, "native": [act], "ok": True, "reply": {"ok": True, "result": result}}


def test_which_steps_are_judged_by_their_result() -> None:
    assert judged_by_result(_event({"type": "exec", "command": "true"}, {}))
    assert judged_by_result(_event({"type": "file_list", "path": "."}, {}))
    assert not judged_by_result(_event({"type": "click", "x": 1, "y": 1}, {}))
    # Refused before it was planned: the request's own type says what it was.
    assert action_type({"request": {"action": {"type": "file_write"}}, "native": None}) == "file_write"
    assert action_type({"request": "{torn", "native": None}) is None


def test_a_pid_map_rewrites_only_process_actions_with_a_known_pid() -> None:
    pids = PidMap()
    pids.learn(_event({"type": "exec", "command": "sleep 9", "background": True}, {"pid": 100}), {"result": {"pid": 7}})
    pids.learn(_event({"type": "file_stat", "path": "x"}, {"pid": 5}), {"result": {"pid": 6}})  # not an exec
    assert pids.pids == {100: 7}
    request = {"id": 3, "action": {"type": "process_kill", "pid": 100, "signal": "SIGTERM"}}
    assert pids.request(request) == {"id": 3, "action": {"type": "process_kill", "pid": 7, "signal": "SIGTERM"}}
    assert request["action"]["pid"] == 100  # the recorded request is left as it was
    other = {"id": 4, "action": {"type": "process_kill", "pid": 101}}
    assert pids.request(other) is other
    assert pids.request({"id": 5, "action": {"type": "click", "pid": 100}})["action"]["pid"] == 100


def test_an_upload_kept_only_in_part_cannot_be_resent() -> None:
    whole = redact(_event({"type": "file_write", "path": "a", "content": "tiny"}, {}))
    assert cut_upload(whole) is None
    cut = redact(_event({"type": "process_write", "pid": 1, "data": "d" * 4000}, {}))
    reason = cut_upload(cut)
    assert reason is not None and reason.startswith("the recording kept only the start of its data (4000 bytes")


def test_judge_names_every_failed_check() -> None:
    recorded = _event({"type": "exec", "command": "x"}, {"exit_code": 0, "stdout": "a", "stderr": "b"})
    judgement = judge(recorded, {"result": {"exit_code": 0, "stdout": "a", "stderr": "c"}}, {"stderr": "exact"})
    assert not judgement.passed
    assert judgement.reason.startswith("stderr differs: 1 bytes, sha256 ")
    assert [c.name for c in judgement.checks] == ["exit code", "stderr"]
    assert str(Check("exit code", "0", "0", True)) == "exit code matches: 0, recorded 0"


def test_an_output_cut_by_the_text_cap_without_a_digest_is_not_compared() -> None:
    # An older bundle: no payloads, and the gateway cut the reply: there is nothing whole to compare.
    recorded = {
        **_event({"type": "exec", "command": "x"}, {"exit_code": 0, "stdout": "abc"}),
        "truncated": {"reply": 9},
    }
    judgement = judge(recorded, {"result": {"exit_code": 0, "stdout": "zzz"}}, {"stdout": "exact"})
    assert judgement.passed and [c.name for c in judgement.checks] == ["exit code"]
