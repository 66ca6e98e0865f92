"""``corral profile`` and ``session create --profile`` through the gateway client, over a fake transport."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
from typer.testing import CliRunner

from corral.cli import app
from corral.errors import error_body

from .conftest import Handler

PROFILE = {"name": "shop", "size": 2048, "saved_at": 1.7e9}


def test_create_asks_for_the_profile_and_whether_it_is_saved(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    seen = gateway(lambda request: httpx.Response(201, json={"id": "ses_1", "token": "tok"}))
    result = CliRunner().invoke(app, ["session", "create", "--json", "--profile", "shop:save"])
    assert result.exit_code == 0, result.output
    assert json.loads(seen[0].content)["profile"] == {"name": "shop", "save": True}
    CliRunner().invoke(app, ["session", "create", "--json", "--profile", "shop"])
    assert json.loads(seen[1].content)["profile"] == {"name": "shop", "save": False}
    wrong = CliRunner().invoke(app, ["session", "create", "--profile", "shop:keep"])
    assert wrong.exit_code == 2 and len(seen) == 2


def test_list_show_save_and_rm(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/profiles":
            return httpx.Response(200, json=[PROFILE])
        if request.method == "DELETE":
            return httpx.Response(200, json={"name": "shop", "deleted": True})
        return httpx.Response(200, json=PROFILE)

    seen = gateway(handler)
    runner = CliRunner()
    listed = runner.invoke(app, ["profile", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == [PROFILE]
    assert runner.invoke(app, ["profile", "show", "shop"]).exit_code == 0
    assert runner.invoke(app, ["profile", "save", "ses_1", "--json"]).exit_code == 0
    assert runner.invoke(app, ["profile", "rm", "shop"]).exit_code == 0
    assert [(r.method, r.url.path) for r in seen] == [
        ("GET", "/v1/profiles"),
        ("GET", "/v1/profiles/shop"),
        ("POST", "/v1/sessions/ses_1/profile/save"),
        ("DELETE", "/v1/profiles/shop"),
    ]


def test_a_missing_profile_is_said_plainly(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    gateway(lambda request: httpx.Response(404, json=error_body("not_found", "no profile 'shop'")))
    result = CliRunner().invoke(app, ["profile", "show", "shop"])
    assert result.exit_code != 0
    assert "no profile 'shop'" in result.output
