"""``corral preview`` through the gateway client, over a fake transport."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
from typer.testing import CliRunner

from corral.cli import app
from corral.errors import error_body

from .conftest import Handler

HEX = "0123456789abcdef"
CREATED = {
    "id": "prv_1",
    "port": 3000,
    "host": f"3000-{HEX}.localhost",
    "url": f"http://3000-{HEX}.localhost:8701/?corral_preview=crl_prev_abc",
    "created_at": 1.0,
    "expires_at": 3601.0,
}
ROW = {k: v for k, v in CREATED.items() if k != "url"} | {
    "revoked_at": None,
    "last_used_at": None,
    "connections": 3,
    "bytes_in": 10,
    "bytes_out": 20,
}


def _handler(request: httpx.Request) -> httpx.Response:
    if request.method == "POST":
        return httpx.Response(201, json=CREATED)
    if request.method == "DELETE":
        return httpx.Response(200, json={"id": "prv_1", "revoked_at": 9.0})
    return httpx.Response(200, json={"previews": [ROW, ROW | {"id": "prv_2", "revoked_at": 8.0}]})


def test_create_prints_the_url_alone_on_stdout(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    seen = gateway(_handler)
    result = CliRunner().invoke(app, ["preview", "create", f"ses_{HEX}", "3000", "--ttl", "600"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == CREATED["url"]  # a script takes it with $(corral preview create ...)
    assert f"http://3000-{HEX}.localhost:8701/" in result.stderr and "prv_1" in result.stderr
    assert (seen[0].method, seen[0].url.path) == ("POST", f"/v1/sessions/ses_{HEX}/previews")
    assert json.loads(seen[0].content) == {"port": 3000, "ttl_s": 600}


def test_create_json_carries_the_sandbox_url_too(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    seen = gateway(_handler)
    result = CliRunner().invoke(app, ["preview", "create", f"ses_{HEX}", "3000", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == CREATED | {"sandbox_url": f"http://3000-{HEX}.localhost:8701/"}
    assert json.loads(seen[0].content) == {"port": 3000}


def test_list_and_revoke(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    seen = gateway(_handler)
    runner = CliRunner()
    listed = runner.invoke(app, ["preview", "list", f"ses_{HEX}", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [row["id"] for row in json.loads(listed.stdout)["previews"]] == ["prv_1", "prv_2"]
    table = runner.invoke(app, ["preview", "list", f"ses_{HEX}"])
    assert table.exit_code == 0 and "revoked" in table.stdout and "crl_prev" not in table.stdout
    revoked = runner.invoke(app, ["preview", "revoke", f"ses_{HEX}", "prv_1", "--json"])
    assert json.loads(revoked.stdout) == {"id": "prv_1", "revoked_at": 9.0}
    assert [(r.method, r.url.path) for r in seen] == [
        ("GET", f"/v1/sessions/ses_{HEX}/previews"),
        ("GET", f"/v1/sessions/ses_{HEX}/previews"),
        ("DELETE", f"/v1/sessions/ses_{HEX}/previews/prv_1"),
    ]


def test_a_bad_port_or_ttl_is_refused_before_any_request(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    seen = gateway(_handler)
    runner = CliRunner()
    for argv in (["0"], ["65536"], ["3000", "--ttl", "0"], ["3000", "--ttl", "86401"]):
        result = runner.invoke(app, ["preview", "create", "ses_1", *argv])
        assert result.exit_code == 2, argv
    assert seen == []


def test_a_refusal_is_said_plainly(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    gateway(lambda request: httpx.Response(409, json=error_body("session_ended", "session ses_1 has ended")))
    result = CliRunner().invoke(app, ["preview", "create", "ses_1", "3000"])
    assert result.exit_code == 1
    assert "session ses_1 has ended" in result.output and "Traceback" not in result.output
