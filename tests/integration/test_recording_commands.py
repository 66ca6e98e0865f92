"""Commands and files in a real recording: redacted in the bundle, replayed by their results."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.recording.bundle import read_bundle
from corral.recording.redact import INPUT_PREFIX_BYTES
from corral.sdk import Sandbox

from .gateway_fixtures import KEY_A, RunningGateway, gateway, replay_cli, unpack_recording

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

SCRIPT = "print('hello from the workspace')\n"
BIG = bytes(range(256)) * 16  # 4 KiB: over the upload prefix, so the recording keeps its start only
PRINTED = 200_000  # bytes of stdout: over the recording's output budget


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway(tmp_path_factory.mktemp("rec-cmd-gw"), f"rec-cmd-{os.getpid()}") as running:
        yield running


@pytest.fixture(scope="module")
def recorded(gw: RunningGateway, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session that writes a script and runs it, prints a lot, uploads 4 KiB, and waits for a
    background command: recorded, downloaded and unpacked."""
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.act({"type": "file_write", "path": "/workspace/hello.py", "content": SCRIPT})
        sb.act({"type": "exec", "argv": ["python3", "hello.py"], "cwd": "/workspace"})
        sb.act({"type": "exec", "command": f"head -c {PRINTED} /dev/zero | tr '\\0' x; exit 3"})
        sb.act({"type": "file_write", "path": "/workspace/big.bin", "content_base64": base64.b64encode(BIG).decode()})
        started = sb.act({"type": "exec", "command": "sleep 0.3; exit 4", "background": True})
        sb.act({"type": "process_wait", "pid": started["result"]["pid"], "timeout_ms": 10_000})
        session_id = sb.id
    target = tmp_path_factory.mktemp("recorded-commands")
    return unpack_recording(gw, session_id, target, lambda bundle: len(bundle.actions) == 6)


def test_the_bundle_holds_commands_and_files_redacted(recorded: Path) -> None:
    write, run, loud, upload, background, wait = read_bundle(recorded).actions
    text = (recorded / "events.jsonl").read_text()
    # A small upload whole (it replays), with its digest; the file's sha256 as the action gave it.
    sha = hashlib.sha256(SCRIPT.encode()).hexdigest()
    assert write["request"]["action"]["content"] == SCRIPT
    assert write["payloads"]["request.action.content"] == {"size": len(SCRIPT), "sha256": sha, "truncated": False}
    assert write["reply"]["result"]["sha256"] == sha and write["reply"]["result"]["size"] == len(SCRIPT)
    # The command, its cwd, exit code, duration and output.
    result = run["reply"]["result"]
    assert run["request"]["action"]["argv"] == ["python3", "hello.py"] and run["native"][0]["cwd"] == "/workspace"
    assert (result["exit_code"], result["stdout"], result["stderr"]) == (0, "hello from the workspace\n", "")
    assert isinstance(result["duration_ms"], int | float)
    # A long output is cut to the budget, flagged, and digested whole; the exit code kept.
    assert loud["reply"]["result"]["exit_code"] == 3
    stdout = loud["payloads"]["reply.result.stdout"]
    assert stdout["truncated"] is True and stdout["size"] == PRINTED
    assert stdout["sha256"] == hashlib.sha256(b"x" * PRINTED).hexdigest()
    assert len(loud["reply"]["result"]["stdout"]) < 64 << 10 and "x" * (64 << 10) not in text
    assert "truncated" not in loud  # the redaction cut it: no field had to be cut whole
    # A bigger upload: never whole in the bundle, its size and sha256 instead.
    kept = upload["request"]["action"]["content_base64"]
    assert len(kept) <= INPUT_PREFIX_BYTES and base64.b64encode(BIG).decode() not in text
    assert upload["payloads"]["request.action.content_base64"] == {
        "size": len(BIG),
        "sha256": hashlib.sha256(BIG).hexdigest(),
        "truncated": True,
    }
    assert background["reply"]["result"]["background"] is True
    assert wait["reply"]["result"]["exit_code"] == 4


def test_the_recording_replays_against_a_fresh_sandbox(gw: RunningGateway, recorded: Path, tmp_path: Path) -> None:
    code, junit, report = replay_cli(gw, recorded, tmp_path, "--expect", "stdout=exact")
    assert code == 0, report
    assert 'tests="6"' in junit and 'failures="0"' in junit and 'skipped="1"' in junit, junit
    assert "exit code matches: 0, recorded 0" in junit and "stdout matches" in junit
    assert "kept only the start of its content_base64 (4096 bytes" in junit  # step 4, said why
    assert "exit code matches: 4, recorded 4" in junit  # the wait found the replay's own pid
    assert "<td>exit code</td><td>3</td><td>3</td><td>matches</td>" in report


def test_a_different_exit_code_fails_that_step_with_a_clear_verdict(
    gw: RunningGateway, recorded: Path, tmp_path: Path
) -> None:
    changed = tmp_path / "changed"
    shutil.copytree(recorded, changed)
    events = changed / "events.jsonl"
    lines: list[dict[str, Any]] = [json.loads(line) for line in events.read_text().splitlines() if line]
    lines[1]["reply"]["result"]["exit_code"] = 1  # step 2 recorded as failing; it exits 0 again
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, junit, report = replay_cli(gw, changed, tmp_path)
    assert code == 1, report
    assert 'failures="1"' in junit
    failing = junit.split("<failure")[0].rsplit("<testcase", 1)[1]
    assert "step 2: exec" in failing
    assert 'message="exit code differs: 0, recorded 1"' in junit
    assert "Step 2: exec" in report and report.count("DIVERGED") == 1


TOKEN = "tok-9f2c1e-never-in-a-recording"
NOTE = "written by file_write, downloaded over HTTP\n"


def _kill_while_it_runs(sb: Sandbox) -> None:
    """A foreground exec killed by a process_kill sent on the same connection while it runs."""
    done: list[dict[str, Any]] = []
    runner = threading.Thread(
        target=lambda: done.append(sb.request({"action": {"type": "exec", "command": "sleep 600"}})), daemon=True
    )
    runner.start()
    deadline = time.monotonic() + 10
    while True:
        listed = sb.act({"type": "process_list"})["result"]["processes"]
        found = [p["pid"] for p in listed if p["command"] == "sleep 600" and p["running"]]
        if found:
            break
        assert time.monotonic() < deadline, "the exec never showed in process_list"
        time.sleep(0.05)
    sb.act({"type": "process_kill", "pid": found[0]})
    runner.join(10)
    assert done and done[0]["result"]["signal"] == "SIGKILL"


@pytest.fixture(scope="module")
def recorded_more(gw: RunningGateway, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session with an env secret, files moved over HTTP both ways (a file and a directory), and an
    exec killed while it ran: recorded, downloaded and unpacked."""
    local = tmp_path_factory.mktemp("transfers")
    (local / "up.bin").write_bytes(BIG)
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.act({"type": "exec", "command": 'test -n "$API_TOKEN"; echo set', "env": {"API_TOKEN": TOKEN}})
        sb.files.upload(local / "up.bin", "/workspace/uploaded/up.bin", make_dirs=True)
        sb.act({"type": "file_write", "path": "/workspace/out/note.txt", "content": NOTE, "make_dirs": True})
        sb.files.download("/workspace/out/note.txt", local / "note.txt")
        sb.files.download("/workspace/out", local / "out")
        _kill_while_it_runs(sb)
        session_id = sb.id
    target = tmp_path_factory.mktemp("recorded-more")
    # The killed exec ends last (its event after the kill's); process_list ran as often as it took.
    return unpack_recording(gw, session_id, target, lambda bundle: any(_ran(e, "sleep 600") for e in bundle.actions))


def _ran(event: dict[str, Any], command: str) -> bool:
    return bool(event.get("native")) and event["native"][0].get("command") == command


def test_env_values_and_moved_bytes_never_reach_the_bundle(recorded_more: Path) -> None:
    text = (recorded_more / "events.jsonl").read_text()
    assert TOKEN not in text and base64.b64encode(BIG).decode()[:200] not in text
    actions = read_bundle(recorded_more).actions
    env = actions[0]["request"]["action"]["env"]
    assert env == {"API_TOKEN": {"size": len(TOKEN), "sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}}
    assert actions[0]["reply"]["result"]["exit_code"] == 0  # the command had its value


def test_uploads_and_downloads_over_http_are_recorded_with_size_and_sha256(recorded_more: Path) -> None:
    moved = [e for e in read_bundle(recorded_more).actions if e.get("dialect") == "http"]
    upload, download, directory = moved
    assert upload["native"][0] == {"type": "file_upload", "path": "/workspace/uploaded/up.bin", "make_dirs": "1"}
    assert upload["reply"]["result"] == {
        "direction": "upload",
        "path": "/workspace/uploaded/up.bin",
        "size": len(BIG),
        "sha256": hashlib.sha256(BIG).hexdigest(),
    }
    got = download["reply"]["result"]
    assert (got["direction"], got["type"], got["complete"]) == ("download", "file", True)
    assert (got["size"], got["sha256"]) == (len(NOTE), hashlib.sha256(NOTE.encode()).hexdigest())
    tar = directory["reply"]["result"]
    assert (tar["type"], tar["complete"]) == ("directory", True) and tar["size"] > len(NOTE)
    assert all(e["frame"] is None and e["ok"] for e in moved)


def test_a_kill_sent_while_its_exec_ran_came_in_after_it_though_it_ended_first(recorded_more: Path) -> None:
    actions = read_bundle(recorded_more).actions
    [run] = [e for e in actions if _ran(e, "sleep 600")]
    [kill] = [e for e in actions if (e.get("native") or [{}])[0].get("type") == "process_kill"]
    assert kill["seq"] < run["seq"]  # written as they ended
    assert run["request_seq"] < kill["request_seq"]  # but the exec came in first


def test_the_second_recording_replays_in_the_order_requests_came_in(
    gw: RunningGateway, recorded_more: Path, tmp_path: Path
) -> None:
    code, junit, report = replay_cli(gw, recorded_more, tmp_path)
    assert code == 0, report
    assert 'failures="0"' in junit and 'skipped="1"' in junit, junit
    # Each step's reason is in the report (JUnit lists a passed step's checks only).
    assert "sent without env.API_TOKEN" in report
    assert "an upload over HTTP (4096 bytes" in junit  # skipped, saying why
    assert "sha256 matches" in report and "re-checked with file_stat and sha256sum" in report
    assert "tar is not compared byte for byte" in report
    assert "sent without waiting for its reply" in report
    kill = junit.split("process_kill")[1].split("</testcase>")[0]
    assert "<failure" not in kill and "<skipped" not in kill
