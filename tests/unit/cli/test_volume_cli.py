"""``corral volume`` and ``session create --volume`` through the SDK's gateway client, over a fake transport."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
from typer.testing import CliRunner

from corral.cli import app, auditwords
from corral.errors import error_body

from .conftest import Handler

VOLUME = {"name": "work", "size_mb": 512, "used_bytes": 3072, "in_use_by": None, "created_at": 1.0}


def test_create_list_and_rm_send_what_was_given(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json=VOLUME)
        if request.method == "GET":
            return httpx.Response(200, json=[VOLUME | {"in_use_by": "ses_1"}])
        return httpx.Response(204)

    seen = gateway(answer)
    made = CliRunner().invoke(app, ["volume", "create", "work", "--size-mb", "512", "--json"])
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout) == VOLUME
    listed = CliRunner().invoke(app, ["volume", "list"])
    assert listed.exit_code == 0 and "ses_1" in listed.stdout and "512 MiB" in listed.stdout
    removed = CliRunner().invoke(app, ["volume", "rm", "work"])
    assert removed.exit_code == 0 and "deleted volume work" in removed.stdout
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/v1/volumes"),
        ("GET", "/v1/volumes"),
        ("DELETE", "/v1/volumes/work"),
    ]
    assert json.loads(seen[0].content) == {"name": "work", "size_mb": 512}


def test_rm_of_a_held_volume_fails_with_the_gateways_words(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    body = error_body("volume_in_use", "volume 'work' is held by session ses_1", "volume")
    gateway(lambda request: httpx.Response(409, json=body))
    result = CliRunner().invoke(app, ["volume", "rm", "work"])
    assert result.exit_code == 1 and "held by session ses_1" in result.output


def test_session_create_names_its_volume(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    session = {"id": "ses_1", "token": "tok", "ws_url": "ws://x", "created_at": 1.0, "expires_at": 2.0}
    seen = gateway(lambda request: httpx.Response(201, json=session | {"viewport": {"width": 1, "height": 1}}))
    result = CliRunner().invoke(app, ["session", "create", "--volume", "work", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(seen[0].content)["volume"] == "work"


def test_audit_show_says_a_volume_record_in_words() -> None:
    record = {"event": "volume", "volume": "work", "change": "released", "size_mb": 64, "used_bytes": 3 << 20}
    assert auditwords.detail(record) == "volume work released: 3.0 of 64 MiB used"  # type: ignore[arg-type]
