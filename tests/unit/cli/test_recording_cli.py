"""`corral recording ls` shows what the listing says, the budget's cut included."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from corral.cli import app, common
from corral.gateway_client import Gateway

ROWS = [
    {
        "session": "ses_cut1",
        "state": "ended",
        "created_at": 1_714_564_800.0,
        "ended_at": 1_714_564_860.0,
        "events": 31,
        "bytes": 2097100,
        "budget_bytes": 2097152,
        "cut": "budget",
    },
    {
        "session": "ses_live2",
        "state": "live",
        "created_at": 1_714_564_900.0,
        "ended_at": None,
        "events": 4,
        "bytes": 9000,
        "budget_bytes": 268435456,
        "cut": None,
    },
]


def test_ls_shows_events_bytes_and_the_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_API_KEY", "key-1")
    monkeypatch.setenv("CORRAL_URL", "http://gateway.test")
    monkeypatch.setattr(common, "out", Console(width=200, force_terminal=False))
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json=ROWS)

    def fake() -> Gateway:
        return Gateway(common.url(), common.api_key(), transport=httpx.MockTransport(handler))

    monkeypatch.setattr(common, "gateway", fake)
    result = CliRunner().invoke(app, ["recording", "ls"])
    assert result.exit_code == 0, result.output
    assert seen == ["/v1/recordings"]
    cut = next(line for line in result.stdout.splitlines() if "ses_cut1" in line)
    assert [cell.strip() for cell in cut.split("│")[1:-1]][4:] == ["31", "2097100", "budget"]
    live = next(line for line in result.stdout.splitlines() if "ses_live2" in line)
    assert [cell.strip() for cell in live.split("│")[1:-1]][4:] == ["4", "9000", "-"]


def test_replay_refuses_an_expect_it_does_not_know_before_reaching_a_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.setenv("CORRAL_URL", "http://gateway.invalid")
    manifest = {"format": "corral-recording", "version": 1, "viewport": {"width": 8, "height": 8}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "events.jsonl").write_text("")
    result = CliRunner().invoke(app, ["replay", str(tmp_path), "--expect", "stdout=fuzzy"])
    assert result.exit_code == 2
    assert "--expect: expect maps stdout/stderr to one of exact, ignore" in result.output
