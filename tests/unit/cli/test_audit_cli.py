from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from corral.cli import app
from corral.proxy.audit import AuditLog


def _log(path: Path) -> None:
    log = AuditLog(path, "ses_1")
    for i in range(4):
        log.write("request", url=f"https://example.test/{i}", status=200)
    log.close()


def test_verify_an_intact_log(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _log(path)
    result = CliRunner().invoke(app, ["audit", "verify", str(path), "--json"])
    assert result.exit_code == 0
    answer = json.loads(result.stdout)
    assert {k: answer[k] for k in ("ok", "records", "first_bad", "reason")} == {
        "ok": True,
        "records": 4,
        "first_bad": None,
        "reason": "",
    }
    assert (answer["status"], answer["anchors"]) == ("unanchored", 0)  # no anchors: says what it cannot prove


def test_verify_names_the_first_altered_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _log(path)
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace('"status":200', '"status":500')
    path.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["audit", "verify", str(path)])
    assert result.exit_code == 1
    assert "line 3" in result.stdout and "changed" in result.stdout


def test_verify_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["audit", "verify", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2
