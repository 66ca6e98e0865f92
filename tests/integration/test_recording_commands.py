"""Commands and files in a real recording: redacted in the bundle, replayed by their results."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.recording.bundle import read_bundle
from corral.recording.redact import INPUT_PREFIX_BYTES
from corral.sdk import Sandbox

from .gateway_fixtures import KEY_A, RunningGateway, gateway

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
    deadline = time.monotonic() + 15
    while True:
        with gw.client(KEY_A) as c:
            response = c.get(f"/v1/sessions/{session_id}/recording")
        assert response.status_code == 200, response.text
        (target / "bundle.zip").write_bytes(response.content)
        with zipfile.ZipFile(target / "bundle.zip") as archive:
            archive.extractall(target)
        if len(read_bundle(target / session_id).actions) == 6:
            return target / session_id
        assert time.monotonic() < deadline, "the recording did not catch up"
        time.sleep(0.2)


def _replay(gw: RunningGateway, bundle: Path, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    junit, report = tmp_path / "junit.xml", tmp_path / "report.html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral.cli",
            "replay",
            str(bundle),
            "--against",
            gw.url,
            "--junit",
            str(junit),
            "--report",
            str(report),
            *extra,
        ],
        env={**os.environ, "CORRAL_API_KEY": KEY_A},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = done.stdout + done.stderr
    return (
        done.returncode,
        junit.read_text() if junit.exists() else output,
        report.read_text() if report.exists() else output,
    )


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
    code, junit, report = _replay(gw, recorded, tmp_path, "--expect", "stdout=exact")
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
    code, junit, report = _replay(gw, changed, tmp_path)
    assert code == 1, report
    assert 'failures="1"' in junit
    failing = junit.split("<failure")[0].rsplit("<testcase", 1)[1]
    assert "step 2: exec" in failing
    assert 'message="exit code differs: 0, recorded 1"' in junit
    assert "Step 2: exec" in report and report.count("DIVERGED") == 1
