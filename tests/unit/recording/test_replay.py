"""Judging a replay, step by step, through a fake sandbox (the ``send`` seam replay() takes)."""

from __future__ import annotations

import base64
import io
import xml.etree.ElementTree as ET
from typing import Any

from PIL import Image

from corral.recording.bundle import Bundle
from corral.recording.redact import redact
from corral.recording.replay import (
    FRAME_REQUEST,
    ReplayOptions,
    ReplayReport,
    StepVerdict,
    html_report,
    junit_xml,
    parse_overrides,
    replay,
)


def webp(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 40), color).save(out, "WEBP")
    return out.getvalue()


WHITE, BLACK = webp((255, 255, 255)), webp((0, 0, 0))


def action(seq: int, frame: bytes | None, ok: bool = True, code: str | None = None, **extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "seq": seq,
        "event": "action",
        "request": {"id": str(seq), "action": {"type": "wait", "ms": 0}},
        "native": [{"type": "wait", "ms": 0}],
        "ok": ok,
        "frame": f"frames/{seq:06d}.webp" if frame is not None else None,
        **extra,
    }
    if code is not None:
        event["error"] = {"code": code, "message": "no"}
    return event


def bundle(events: list[dict[str, Any]], frames: dict[int, bytes]) -> Bundle:
    return Bundle(
        "test",
        {"viewport": {"width": 64, "height": 40}},
        events,
        {f"frames/{seq:06d}.webp": data for seq, data in frames.items()},
    )


class Sandbox:
    """Answers each request as told; screenshots from a list of frames (None: the screenshot fails)."""

    def __init__(self, replies: list[dict[str, Any]], screens: list[bytes | None]) -> None:
        self.replies, self.screens = list(replies), list(screens)

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        if request is FRAME_REQUEST:
            screen = self.screens.pop(0)
            if screen is None:
                return {"ok": False, "error": {"code": "screenshot_failed"}}
            return {"ok": True, "screenshot": {"data": base64.b64encode(screen).decode()}}
        return self.replies.pop(0)


OK = {"ok": True}


def test_identical_frames_pass_and_a_changed_one_diverges() -> None:
    recorded = bundle([action(1, WHITE), action(2, WHITE)], {1: WHITE, 2: WHITE})
    report = replay(recorded, Sandbox([OK, OK], [WHITE, BLACK]), ReplayOptions())
    assert [s.status for s in report.steps] == ["passed", "diverged"]
    assert not report.passed and [s.number for s in report.divergences] == [2]


def test_a_step_without_a_frame_is_skipped_with_its_reason_not_passed() -> None:
    recorded = bundle([action(1, None), action(2, WHITE)], {2: WHITE})
    report = replay(recorded, Sandbox([OK, OK], [WHITE, None]), ReplayOptions())
    assert [s.status for s in report.steps] == ["skipped", "skipped"]
    assert "the recording has no frame" in report.steps[0].reason
    assert "screenshot failed" in report.steps[1].reason
    assert report.passed  # nothing diverged
    suite = ET.fromstring(junit_xml(report))
    assert suite.get("skipped") == "2" and suite.get("failures") == "0"
    messages = [case.find("skipped").get("message") for case in suite.iter("testcase")]  # type: ignore[union-attr]
    assert messages[0].startswith("no frame to compare")  # type: ignore[union-attr]
    assert "2 skipped" in html_report(report)


def test_failing_requests_are_compared_by_their_error_code() -> None:
    recorded = bundle(
        [action(1, WHITE, ok=False, code="out_of_bounds"), action(2, WHITE, ok=False, code="timeout")],
        {1: WHITE, 2: WHITE},
    )
    replies = [{"ok": False, "error": {"code": "out_of_bounds"}}, {"ok": False, "error": {"code": "invalid_field"}}]
    report = replay(recorded, Sandbox(replies, [WHITE, WHITE]), ReplayOptions())
    assert [s.status for s in report.steps] == ["passed", "diverged"]
    assert report.steps[1].reason == "the request failed with invalid_field, recorded timeout"


def test_an_unsettled_recorded_frame_is_named_in_the_verdict() -> None:
    recorded = bundle([action(1, WHITE, frame_settled=False)], {1: WHITE})
    report = replay(recorded, Sandbox([OK], [BLACK]), ReplayOptions())
    assert report.steps[0].status == "diverged"
    assert "before the screen settled" in report.steps[0].reason and "re-record" in report.steps[0].reason


def test_lost_events_are_warned_about_in_every_report() -> None:
    events = [
        action(1, WHITE),
        {"seq": 2, "event": "gap", "lost": 3},
        {"seq": 3, "event": "controller_restarted"},
        action(4, WHITE),
    ]
    logged: list[str] = []
    report = replay(
        bundle(events, {1: WHITE, 4: WHITE}), Sandbox([OK, OK], [WHITE, WHITE]), ReplayOptions(), logged.append
    )
    assert report.passed and len(report.warnings) == 2
    assert "lost 3 event(s)" in report.warnings[0] and "restarted" in report.warnings[1]
    assert logged[:2] == [f"warning: {w}" for w in report.warnings]
    suite = ET.fromstring(junit_xml(report))
    assert [p.get("value") for p in suite.iter("property")] == report.warnings
    assert "lost 3 event(s)" in (suite.findtext("system-out") or "")
    page = html_report(report)
    assert "id=warnings" in page and "lost 3 event(s)" in page


def test_junit_survives_control_characters_in_typed_text() -> None:
    step = StepVerdict(1, "type text=a\x08\x00b", True, True, 0.01, 0.5, "diverged", "differs \x1b")
    suite = ET.fromstring(junit_xml(ReplayReport("bundle\x07", [step])))
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("1", "1", "0")
    [case] = suite.findall("testcase")
    # Each character XML 1.0 cannot hold is a "?", the rest kept as typed.
    assert (case.get("classname"), case.get("name")) == ("bundle?", "step 1: type text=a??b")
    failure = case.find("failure")
    assert failure is not None and failure.get("message") == failure.text == "differs ?"


def command(seq: int, act: dict[str, Any], result: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A recorded command or file step, redacted as the recorder keeps it (no frame compared)."""
    from corral.recording.redact import redact

    event = {
        "seq": seq,
        "event": "action",
        "request": {"id": str(seq), "action": act},
        "native": [act],
        "ok": True,
        "reply": {"ok": True, "id": str(seq), "result": result},
        "frame": None,
        **extra,
    }
    return redact(event, output_budget=16)


def exec_result(exit_code: int | None, stdout: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "pid": 40,
        "exit_code": exit_code,
        "signal": None,
        "stdout": stdout,
        "stderr": "",
        "timed_out": False,
        "duration_ms": 5.0,
        "encoding": "utf-8",
        **extra,
    }


class Commands:
    """A sandbox that answers each request as told, keeping what it was sent (never a screenshot)."""

    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.results, self.sent = list(results), []  # type: list[dict[str, Any]], list[dict[str, Any]]

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        assert request is not FRAME_REQUEST, "a command step's screen is not compared"
        self.sent.append(request)
        return {"ok": True, "id": request.get("id"), "result": self.results.pop(0)}


def test_an_exec_step_passes_on_its_exit_code_and_says_why_when_it_differs() -> None:
    run = {"type": "exec", "command": "make test", "cwd": "/workspace"}
    recorded = bundle([command(1, run, exec_result(0, "all good " * 100)), command(2, run, exec_result(0))], {})
    report = replay(recorded, Commands([exec_result(0, "other output"), exec_result(2)]), ReplayOptions())
    assert [s.status for s in report.steps] == ["passed", "diverged"]
    assert report.steps[0].reason == "exit code matches: 0, recorded 0"  # stdout not compared unless asked
    assert report.steps[1].reason == "exit code differs: 2, recorded 0"
    assert report.steps[1].judged_on == "result" and report.steps[1].score is None
    suite = ET.fromstring(junit_xml(report))
    failure = suite.findall("testcase")[1].find("failure")
    assert failure is not None and failure.get("message") == "exit code differs: 2, recorded 0"
    page = html_report(report)
    assert "<td>exit code</td><td>0</td><td>2</td><td>DIFFERS</td>" in page and "<img" not in page


def test_stdout_is_compared_by_sha256_when_the_step_asks_even_when_the_recording_cut_it() -> None:
    run = {"type": "exec", "argv": ["seq", "1000"]}
    full = "".join(f"{n}\n" for n in range(1, 1001))
    recorded = bundle([command(1, run, exec_result(0, full)), command(2, run, exec_result(0, full))], {})
    assert recorded.events[0]["payloads"]["reply.result.stdout"]["truncated"] is True
    options = ReplayOptions(overrides=parse_overrides('{"2": {"expect": {"stdout": "exact"}}}'))
    report = replay(recorded, Commands([exec_result(0, full), exec_result(0, full[:-2])]), options)
    assert report.steps[0].status == "passed"
    assert report.steps[1].status == "diverged" and report.steps[1].reason.startswith("stdout differs: ")
    assert [c.name for c in report.steps[1].checks] == ["exit code", "stdout"]
    everywhere = ReplayOptions(expect={"stdout": "exact"})
    assert replay(recorded, Commands([exec_result(0, full)] * 2), everywhere).passed


def test_a_killed_command_is_compared_by_its_signal_and_timeout() -> None:
    run = {"type": "exec", "command": "sleep 600", "timeout_ms": 100}
    killed = exec_result(None, signal="SIGKILL", timed_out=True)
    recorded = bundle([command(1, run, killed)], {})
    assert replay(recorded, Commands([killed]), ReplayOptions()).passed
    report = replay(recorded, Commands([exec_result(0)]), ReplayOptions())
    assert (
        report.steps[0].reason
        == "exit code differs: 0, recorded killed by SIGKILL; timed out differs: False, recorded True"
    )


def test_file_steps_compare_sha256_and_a_cut_upload_is_skipped_with_its_reason() -> None:
    import hashlib

    small, big = "hello\n", "B" * 5000
    sha = hashlib.sha256(small.encode()).hexdigest()
    write = {"type": "file_write", "path": "/workspace/s.txt", "content": small}
    read = {"type": "file_read", "path": "/workspace/s.txt"}
    events = [
        command(1, write, {"path": "/workspace/s.txt", "size": 6, "sha256": sha}),
        command(2, read, {"path": "/workspace/s.txt", "content": small, "encoding": "utf-8", "size": 6}),
        command(3, {"type": "file_write", "path": "/workspace/b", "content": big}, {"path": "/workspace/b"}),
        command(4, {"type": "file_stat", "path": "/workspace/s.txt"}, {"path": "/workspace/s.txt", "size": 6}),
    ]
    sandbox = Commands(
        [
            {"path": "/workspace/s.txt", "size": 6, "sha256": sha},
            {"path": "/workspace/s.txt", "content": "hellO\n", "encoding": "utf-8", "size": 6},
            {"path": "/workspace/s.txt", "size": 6},
        ]
    )
    report = replay(bundle(events, {}), sandbox, ReplayOptions())
    assert [s.status for s in report.steps] == ["passed", "diverged", "skipped", "passed"]
    assert report.steps[0].reason.startswith("sha256 matches: 6 bytes")
    assert report.steps[1].reason.startswith("content sha256 differs")
    assert "kept only the start of its content (5000 bytes" in report.steps[2].reason
    assert report.steps[3].reason == "file_stat succeeded again (judged by its result, not the screen)"
    assert sandbox.sent[0]["action"]["content"] == small  # a small upload is sent again whole
    assert "content" not in report.steps[0].summary  # uploaded bytes stay out of the summary


def test_process_steps_follow_the_pid_the_replay_gave_the_same_exec() -> None:
    start = {"type": "exec", "command": "python3 -i", "background": True}
    write = {"type": "process_write", "pid": 4242, "data": "print(6*7)\n", "eof": True}
    wait = {"type": "process_wait", "pid": 4242, "timeout_ms": 5000}
    unknown = {"type": "process_kill", "pid": 9}
    events = [
        command(1, start, {"pid": 4242, "background": True}),
        command(2, write, {"pid": 4242, "written": 11}),
        command(3, wait, {"pid": 4242, "exit_code": 0, "signal": None, "running": False, "timed_out": False}),
        command(4, unknown, {"pid": 9, "signal": "SIGKILL"}),
    ]
    sandbox = Commands(
        [
            {"pid": 77, "background": True},
            {"pid": 77, "written": 11},
            {"pid": 77, "exit_code": 1, "signal": None, "running": False, "timed_out": False},
            {"pid": 9, "signal": "SIGKILL"},
        ]
    )
    report = replay(bundle(events, {}), sandbox, ReplayOptions())
    assert [r["action"]["pid"] for r in sandbox.sent[1:]] == [77, 77, 9]  # 9 was never started: sent as it was
    assert [s.status for s in report.steps] == ["passed", "passed", "diverged", "passed"]
    assert report.steps[0].checks[0].recorded == "pid 4242 is pid 77 now"
    assert report.steps[2].reason == "exit code differs: 1, recorded 0"
    still = Commands([{"pid": 5, "background": True}, {"pid": 5, "written": 11}, {"pid": 5, "running": True}, {}])
    assert "still running" in replay(bundle(events, {}), still, ReplayOptions()).steps[2].reason


def test_a_command_that_fails_again_alike_passes_and_otherwise_diverges() -> None:
    run = {"type": "exec", "argv": ["nope"]}
    event = {**command(1, run, {}), "ok": False, "error": {"code": "program_not_found"}, "reply": {"ok": False}}
    refused = bundle([event], {})

    def answer(code: str) -> Any:
        return lambda request: {"ok": False, "error": {"code": code}}

    assert replay(refused, answer("program_not_found"), ReplayOptions()).steps[0].reason == (
        "failed again with program_not_found, as recorded"
    )
    assert replay(refused, answer("no_such_file"), ReplayOptions()).steps[0].status == "diverged"


def test_expect_in_overrides_is_checked() -> None:
    assert parse_overrides('{"1": {"expect": {"stderr": "exact"}}}')[1].expect == {"stderr": "exact"}
    for bad in (
        '{"1": {"expect": {"stdout": "fuzzy"}}}',
        '{"1": {"expect": {"exit": "exact"}}}',
        '{"1": {"expect": 1}}',
    ):
        try:
            parse_overrides(bad)
        except ValueError as exc:
            assert "expect maps stdout/stderr" in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_an_exec_step_is_summarised_by_what_it_ran() -> None:
    from corral.recording.replay import summarize

    assert summarize({"native": [{"type": "exec", "command": "make -j2", "cwd": "/workspace"}]}) == "exec make -j2"
    assert summarize({"native": [{"type": "exec", "argv": ["ls", "-l", "my dir"]}]}) == "exec ls -l 'my dir'"


def test_what_the_sandbox_said_is_escaped_in_the_report() -> None:
    run = {"type": "exec", "command": "<b>x</b>"}
    recorded = bundle([command(1, run, exec_result(None, signal="<script>alert(1)</script>"))], {})
    report = replay(recorded, Commands([exec_result(0)]), ReplayOptions())
    page = html_report(report)
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>x</b>" not in page and "exec &lt;b&gt;x&lt;/b&gt;" in page
    ET.fromstring(junit_xml(report))  # and the XML stays well-formed


def test_an_exec_whose_env_values_were_hidden_is_sent_without_them_and_says_so() -> None:
    run = {"type": "exec", "command": "deploy", "env": {"API_TOKEN": "s3cr3t", "MODE": "fast"}}
    recorded = bundle([command(1, run, exec_result(0))], {})
    assert "s3cr3t" not in str(recorded.events)
    sandbox = Commands([exec_result(0)])
    report = replay(recorded, sandbox, ReplayOptions())
    assert sandbox.sent[0]["action"] == {"type": "exec", "command": "deploy", "env": {}}
    assert report.steps[0].status == "passed"
    assert report.steps[0].reason == (
        "exit code matches: 0, recorded 0; sent without env.API_TOKEN, env.MODE "
        "(a recording keeps only the size and sha256 of env values)"
    )
    diverged = replay(recorded, Commands([exec_result(1)]), ReplayOptions()).steps[0]
    assert diverged.status == "diverged" and "sent without env.API_TOKEN" in diverged.reason


def transfer(seq: int, step: dict[str, Any], result: dict[str, Any], ok: bool = True) -> dict[str, Any]:
    """A file moved over HTTP as the controller records it (corral.sandbox.tools.transfer_record)."""
    event = {
        "seq": seq,
        "event": "action",
        "dialect": "http",
        "request": {"http": "GET /v1/files", "query": {"path": step["path"]}},
        "native": [step],
        "ok": ok,
        "reply": {"ok": ok, "result": result},
        "frame": None,
    }
    if not ok:
        event["error"] = event["reply"]["error"] = {"code": "no_such_file", "message": "no"}  # type: ignore[index]
    return event


class Files:
    """Answers file_stat and sha256sum as a sandbox holding ``files`` (path -> (type, sha256)) would."""

    def __init__(self, files: dict[str, tuple[str, str]]) -> None:
        self.files, self.sent = files, []  # type: dict[str, tuple[str, str]], list[dict[str, Any]]

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        assert request is not FRAME_REQUEST
        self.sent.append(request["action"])
        action = request["action"]
        path = action["path"] if action["type"] == "file_stat" else action["argv"][-1]
        if path not in self.files:
            return {"ok": False, "error": {"code": "no_such_file"}}
        kind, sha = self.files[path]
        if action["type"] == "file_stat":
            return {"ok": True, "result": {"path": path, "type": kind}}
        return {"ok": True, "result": {"exit_code": 0, "stdout": f"{sha} *{path}\n"}}


def test_http_transfers_replay_uploads_skipped_and_downloads_rechecked_by_sha256() -> None:
    sha, other = "a" * 64, "b" * 64
    upload = {"direction": "upload", "path": "/workspace/in.bin", "size": 9, "sha256": sha}
    got = {"direction": "download", "type": "file", "size": 9, "sha256": sha, "complete": True}
    events = [
        transfer(1, {"type": "file_upload", "path": "in.bin"}, upload),
        transfer(2, {"type": "file_download", "path": "in.bin"}, {**got, "path": "/workspace/in.bin"}),
        transfer(3, {"type": "file_download", "path": "out"}, {**got, "type": "directory", "sha256": other}),
        transfer(4, {"type": "file_download", "path": "gone"}, {}, ok=False),
    ]
    sandbox = Files({"in.bin": ("file", sha), "out": ("directory", "")})
    report = replay(bundle(events, {}), sandbox, ReplayOptions())
    assert [s.status for s in report.steps] == ["skipped", "passed", "passed", "passed"]
    assert report.steps[0].reason == (
        f"an upload over HTTP (9 bytes, sha256 {sha[:12]}…): a recording keeps no uploaded bytes, "
        "so it cannot be sent again"
    )
    assert report.steps[1].reason.startswith("sha256 matches")
    assert "re-checked with file_stat and sha256sum" in report.steps[1].reason
    assert "a directory's tar is not compared byte for byte" in report.steps[2].reason
    assert report.steps[3].reason.startswith("outcome matches: failed with no_such_file")
    assert all(s.judged_on == "result" for s in report.steps)
    assert sandbox.sent[:2] == [
        {"type": "file_stat", "path": "in.bin"},
        {"type": "exec", "argv": ["sha256sum", "-b", "--", "in.bin"]},
    ]
    changed = replay(bundle(events[1:2], {}), Files({"in.bin": ("file", other)}), ReplayOptions())
    assert changed.steps[0].status == "diverged" and changed.steps[0].reason.startswith("sha256 differs")
    missing = replay(bundle(events[1:2], {}), Files({}), ReplayOptions())
    assert missing.steps[0].status == "diverged" and "failed with no_such_file" in missing.steps[0].reason


class Concurrent:
    """A sandbox where a foreground exec runs until a process_kill for its pid (77) comes."""

    def __init__(self) -> None:
        import threading

        self.killed = threading.Event()
        self.sent: list[dict[str, Any]] = []

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        action = request["action"]
        self.sent.append(action)
        if action["type"] == "exec":
            assert self.killed.wait(10), "the kill never came while the exec ran"
            return {"ok": True, "result": {**exec_result(None, signal="SIGKILL"), "pid": 77}}
        if action["type"] == "process_list":
            running = {"pid": 77, "command": "sleep 600", "argv": ["bash", "-lc", "sleep 600"], "running": True}
            return {"ok": True, "result": {"processes": [{"pid": 12, "command": "other", "running": True}, running]}}
        assert action == {"type": "process_kill", "pid": 77}, action
        self.killed.set()
        return {"ok": True, "result": {"pid": 77, "signal": "SIGKILL"}}


def test_a_kill_sent_while_its_exec_ran_is_replayed_in_that_order_with_the_replays_pid() -> None:
    run = {"type": "exec", "command": "sleep 600"}
    kill = {"type": "process_kill", "pid": 40}
    # Recorded as they ended: the kill first (seq 1), then the exec it killed (seq 2).
    events = [
        command(1, kill, {"pid": 40, "signal": "SIGKILL"}, request_seq=2, started=101.0, elapsed_ms=1.0),
        command(2, run, exec_result(None, signal="SIGKILL"), request_seq=1, started=100.0, elapsed_ms=1500.0),
    ]
    sandbox = Concurrent()
    report = replay(bundle(events, {}), sandbox, ReplayOptions())
    assert [s.summary for s in report.steps] == ["exec sleep 600", "process_kill pid=40"]
    assert [s.status for s in report.steps] == ["passed", "passed"]
    assert report.steps[0].reason.startswith("exit code matches: killed by SIGKILL, recorded killed by SIGKILL")
    assert "sent without waiting for its reply" in report.steps[0].reason
    assert [a["type"] for a in sandbox.sent if a["type"] != "exec"] == ["process_list", "process_kill"]


def test_control_events_lease_actions_and_requests_refused_by_the_lease_are_not_sent_again() -> None:
    lease = {"type": "request_control", "reason": "solve the CAPTCHA", "wait_ms": 300000}
    asked = action(2, None, native=[lease], request={"id": "2", "action": lease})
    refused = action(3, WHITE, ok=False, code="control_taken")
    changed = {"seq": 4, "event": "control", "change": "taken", "holder": "human:lnk_a", "previous": "agent"}
    recorded = bundle([action(1, WHITE), asked, refused, changed, action(5, WHITE)], {1: WHITE, 3: WHITE, 5: WHITE})
    sandbox = Sandbox([OK, OK], [WHITE, WHITE])
    report = replay(recorded, sandbox, ReplayOptions())
    assert [s.status for s in report.steps] == ["passed", "skipped", "skipped", "passed"]
    assert "request_control waited for a person" in report.steps[1].reason
    assert "control_taken" in report.steps[2].reason
    assert sandbox.replies == [] and report.warnings == []


def test_a_persons_redacted_typing_is_not_typed_again_and_the_step_says_so() -> None:
    typed = {"type": "type", "text": "c0rrect-h0rse"}
    human = redact(action(2, WHITE, native=[typed], request={"action": typed}, dialect="human", actor="human:lnk_a"))
    chord = {"type": "key", "keys": "Return"}
    pressed = redact(action(3, WHITE, native=[chord], request={"action": chord}, dialect="human", actor="human:lnk_a"))
    recorded = bundle([action(1, WHITE), human, pressed], {1: WHITE, 2: WHITE, 3: WHITE})
    sandbox = Sandbox([OK, OK], [WHITE, WHITE])
    report = replay(recorded, sandbox, ReplayOptions())
    assert [s.status for s in report.steps] == ["passed", "skipped", "passed"]
    assert "typed 13 character(s)" in report.steps[1].reason and "redacted" in report.steps[1].reason
    assert sandbox.replies == []  # the agent's step and the person's Return were sent; the typing was not
