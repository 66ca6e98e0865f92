"""``corral downloads`` through the gateway client, over a fake transport."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli import app, common

from .conftest import Handler

S = "ses_0123456789abcdef"
GUID = "c341624d-6c3a-4174-aff6-77bed4879276"
ROW = {
    "id": GUID,
    "name": "report.pdf",
    "path": "/home/agent/Downloads/report.pdf",
    "url": "https://x.test/report.pdf",
    "mime_type": "application/pdf",
    "state": "completed",
    "size": 5,
    "total_bytes": 5,
    "started_at": 1.0,
    "finished_at": 2.0,
    "cause": {"kind": "action", "action_id": "a3.beef", "action": "navigate", "actor": None},
    "error": None,
}
LISTED = {"downloads": [ROW], "total_bytes": 5, "max_file_bytes": 9, "max_session_bytes": 99}


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith(f"/downloads/{GUID}"):
        return httpx.Response(200, content=b"%PDF!", headers={"content-type": "application/pdf"})
    return httpx.Response(200, json=LISTED)


def test_list_as_a_table_and_as_json(
    gateway: Callable[[Handler], list[httpx.Request]], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = gateway(_handler)
    monkeypatch.setattr(common.out, "width", 400)  # the table's cells whole, whatever the terminal
    table = CliRunner().invoke(app, ["downloads", "list", S])
    assert table.exit_code == 0, table.output
    assert GUID in table.stdout and "report.pdf" in table.stdout and "navigate a3.beef" in table.stdout
    as_json = CliRunner().invoke(app, ["downloads", "list", S, "--json"])
    assert json.loads(as_json.stdout) == LISTED
    assert [(r.method, r.url.path) for r in seen] == [("GET", f"/v1/sessions/{S}/downloads")] * 2


def test_get_saves_under_its_name_here_and_never_over_a_file_without_force(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway(_handler)
    monkeypatch.chdir(tmp_path)
    saved = CliRunner().invoke(app, ["downloads", "get", S, GUID])
    assert saved.exit_code == 0, saved.output
    assert (tmp_path / "report.pdf").read_bytes() == b"%PDF!"
    again = CliRunner().invoke(app, ["downloads", "get", S, GUID])
    assert again.exit_code == 1 and "--force" in again.output
    elsewhere = CliRunner().invoke(app, ["downloads", "get", S, GUID, "-o", str(tmp_path / "x.pdf")])
    assert elsewhere.exit_code == 0 and (tmp_path / "x.pdf").read_bytes() == b"%PDF!"
