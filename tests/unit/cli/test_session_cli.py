"""``corral session``, ``do`` and ``screenshot`` through the SDK's gateway client, over a fake transport."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx
from typer.testing import CliRunner

from corral.cli import app
from corral.errors import error_body

from .conftest import Handler

SESSION = {
    "id": "ses_1",
    "token": "tok",
    "ws_url": "ws://gateway.test/v1/sessions/ses_1/ws",
    "state": "ready",
    "created_at": 1.0,
    "expires_at": 2.0,
    "viewport": {"width": 800, "height": 600},
    "allow": ["example.test"],
    "labels": {"via": "cli"},
}


def test_create_sends_only_what_was_given(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    seen = gateway(lambda request: httpx.Response(201, json=SESSION))
    args = ["session", "create", "--json", "--viewport", "800x600", "--allow", "example.test", "--label", "via=cli"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == SESSION
    [request] = seen
    assert (request.method, request.url.path, request.headers["authorization"]) == (
        "POST",
        "/v1/sessions",
        "Bearer key-1",
    )
    assert json.loads(request.content) == {
        "allow": ["example.test"],
        "labels": {"via": "cli"},
        "viewport": {"width": 800, "height": 600},
    }


def test_allow_ls_show_and_rm(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(200, json=[SESSION] if request.url.path == "/v1/sessions" else SESSION)

    seen = gateway(handler)
    runner = CliRunner()
    allowed = runner.invoke(app, ["session", "allow", "ses_1", "a.test", "--egress-mode", "report", "--json"])
    assert allowed.exit_code == 0, allowed.output
    assert json.loads(seen[-1].content) == {"allow": ["a.test"], "egress_mode": "report"}
    assert json.loads(runner.invoke(app, ["session", "ls", "--json"]).stdout) == [SESSION]
    assert "ses_1" in runner.invoke(app, ["session", "show", "ses_1"]).stdout
    removed = runner.invoke(app, ["session", "rm", "ses_1"])
    assert removed.exit_code == 0 and "removed ses_1" in removed.output
    assert [(r.method, r.url.path) for r in seen] == [
        ("PATCH", "/v1/sessions/ses_1"),
        ("GET", "/v1/sessions"),
        ("GET", "/v1/sessions/ses_1"),
        ("DELETE", "/v1/sessions/ses_1"),
    ]


def test_a_refusal_is_one_clean_line(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    gateway(lambda request: httpx.Response(404, json=error_body("not_found", "no session ses_9")))
    result = CliRunner().invoke(app, ["session", "show", "ses_9"])
    assert result.exit_code == 1 and "404 not_found: no session ses_9" in result.output
    assert "Traceback" not in result.output


def test_no_gateway_is_one_clean_line(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    gateway(refuse)
    result = CliRunner().invoke(app, ["session", "ls"])
    assert result.exit_code == 1 and "no answer from the gateway on http://gateway.test" in result.output


def test_do_wraps_a_bare_action_and_exits_1_on_a_failure(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    failure = {"ok": False, "id": None, "error": {"code": "unknown_action", "message": "no action 'teleport'"}}
    seen = gateway(lambda request: httpx.Response(400, json=failure))
    result = CliRunner().invoke(app, ["do", "ses_1", '{"type": "teleport"}'])
    assert result.exit_code == 1
    assert json.loads(result.stdout) == failure  # the sandbox's reply, printed as it came
    assert seen[0].url.path == "/v1/sessions/ses_1/actions"
    assert json.loads(seen[0].content) == {"action": {"type": "teleport"}}


def test_screenshot_writes_the_image(gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path) -> None:
    png = b"\x89PNG\r\n\x1a\nfake"
    reply = {"ok": True, "id": None, "result": {}, "screenshot": {"data": base64.b64encode(png).decode()}}
    seen = gateway(lambda request: httpx.Response(200, json=reply))
    target = tmp_path / "shot.png"
    result = CliRunner().invoke(app, ["screenshot", "ses_1", "-o", str(target), "--format", "png"])
    assert result.exit_code == 0, result.output
    assert target.read_bytes() == png
    assert json.loads(seen[0].content) == {"action": {"type": "screenshot", "format": "png"}}


def test_create_takes_secrets_from_a_file_and_prints_placeholders_only(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path
) -> None:
    value = "ghp_the-real-value-0123"
    secrets = {"GITHUB_TOKEN": {"value": value, "allow": ["example.test"], "in": ["header"]}}
    (tmp_path / "secrets.json").write_text(json.dumps(secrets))
    placeholder = "corral_secret_" + "a" * 32
    seen = gateway(lambda request: httpx.Response(201, json={**SESSION, "secrets": {"GITHUB_TOKEN": placeholder}}))
    args = ["session", "create", "--allow", "example.test", "--secrets-file", str(tmp_path / "secrets.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(seen[0].content)["secrets"] == secrets
    assert f"secret GITHUB_TOKEN: {placeholder}" in result.stdout and value not in result.output


def test_a_secrets_file_that_is_not_secrets_fails_without_quoting_it(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path
) -> None:
    seen = gateway(lambda request: httpx.Response(201, json=SESSION))
    runner = CliRunner()
    (tmp_path / "broken.json").write_text('{"S": {"value": "ghp_leaky-value-0123"')
    (tmp_path / "list.json").write_text('["ghp_leaky-value-0123"]')
    refusals = (("broken.json", "is not JSON"), ("list.json", "must hold an object"), ("none.json", "cannot read"))
    for name, words in refusals:
        result = runner.invoke(app, ["session", "create", "--secrets-file", str(tmp_path / name)])
        said = " ".join(result.output.split())  # as one line, whatever the console wrapped
        assert result.exit_code == 2 and words in said and "leaky" not in said
    assert seen == []


def test_secrets_lists_the_placeholders(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    placeholders = {"A": "corral_secret_" + "a" * 32, "B": "corral_secret_" + "b" * 32}
    seen = gateway(lambda request: httpx.Response(200, json=placeholders))
    runner = CliRunner()
    shown = runner.invoke(app, ["session", "secrets", "ses_1", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == placeholders
    table = runner.invoke(app, ["session", "secrets", "ses_1"])
    assert table.exit_code == 0 and "corral_secret_" + "b" * 32 in table.stdout
    assert [(r.method, r.url.path) for r in seen] == [("GET", "/v1/sessions/ses_1/secrets")] * 2


def test_do_sends_a_vendor_block_verbatim_and_saves_its_image(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path
) -> None:
    png = b"\x89PNG\r\n\x1a\nfake"
    block = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}, "toolset_name": "computer"}
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()},
    }
    tool_result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image], "toolset_name": "computer"}
    seen = gateway(
        lambda request: httpx.Response(200, json={"ok": True, "id": None, "result": {"tool_result": tool_result}})
    )
    target = tmp_path / "shot.png"
    result = CliRunner().invoke(app, ["do", "ses_1", json.dumps({"anthropic": block}), "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert json.loads(seen[0].content) == {"anthropic": block}  # no screenshot field added: the tool decides
    assert target.read_bytes() == png
    [printed] = json.loads(result.stdout)["result"]["tool_result"]["content"]
    assert printed["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "bytes": len(png),
        "saved_to": str(target),
    }


def test_do_prints_a_failed_vendor_call_with_its_error_form_and_exits_1(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
    output = {
        "type": "computer_call_output",
        "call_id": "call_1",
        "output": {"type": "computer_screenshot", "image_url": f"data:image/png;base64,{png}"},
    }
    failure = {
        "ok": False,
        "id": None,
        "error": {"code": "unknown_key", "message": "unknown key 'NOPE'"},
        "result": {"item": output},
    }
    gateway(lambda request: httpx.Response(400, json=failure))
    call = {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "call_1",
        "status": "completed",
        "action": {"type": "keypress", "keys": ["NOPE"]},
    }
    result = CliRunner().invoke(app, ["do", "ses_1", json.dumps({"openai": call})])
    assert result.exit_code == 1
    printed = json.loads(result.stdout)
    assert printed["error"]["code"] == "unknown_key"
    assert printed["result"]["item"]["output"] == {
        "type": "computer_screenshot",
        "image_url": "data:image/png;base64,...",
        "bytes": 12,
    }


def test_do_writes_each_image_of_a_reply_to_its_own_file(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path
) -> None:
    """The first image goes to -o itself, the next ones beside it, numbered: none overwrites another."""
    pngs = [b"\x89PNG\r\n\x1a\n" + bytes([n]) for n in range(3)]
    images = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(p).decode()}}
        for p in pngs
    ]
    tool_result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": images}
    gateway(lambda request: httpx.Response(200, json={"ok": True, "id": None, "result": {"tool_result": tool_result}}))
    block = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}, "toolset_name": "computer"}
    target = tmp_path / "shot.png"
    result = CliRunner().invoke(app, ["do", "ses_1", json.dumps({"anthropic": block}), "-o", str(target)])
    assert result.exit_code == 0, result.output
    paths = [target, tmp_path / "shot-2.png", tmp_path / "shot-3.png"]
    assert [path.read_bytes() for path in paths] == pngs
    printed = json.loads(result.stdout)["result"]["tool_result"]["content"]
    assert [block["source"]["saved_to"] for block in printed] == [str(path) for path in paths]


def test_create_takes_env_pairs_and_set_timeout_patches_timeout_s(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    seen = gateway(lambda request: httpx.Response(201 if request.method == "POST" else 200, json=SESSION))
    runner = CliRunner()
    args = ["session", "create", "--json", "--env", "APP_MODE=staging", "--env", "GREETING=a=b", "--env", "EMPTY="]
    created = runner.invoke(app, args)
    assert created.exit_code == 0, created.output
    assert json.loads(seen[0].content)["env"] == {"APP_MODE": "staging", "GREETING": "a=b", "EMPTY": ""}
    changed = runner.invoke(app, ["session", "set-timeout", "ses_1", "900", "--json"])
    assert changed.exit_code == 0, changed.output
    assert (seen[1].method, seen[1].url.path) == ("PATCH", "/v1/sessions/ses_1")
    assert json.loads(seen[1].content) == {"timeout_s": 900}


def test_a_malformed_env_option_fails_without_repeating_it(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    seen = gateway(lambda request: httpx.Response(201, json=SESSION))
    for bad in ("sk-live-no-equals-sign", "=value-without-a-name"):
        result = CliRunner().invoke(app, ["session", "create", "--env", bad])
        assert result.exit_code == 2 and "NAME=VALUE" in result.output
        assert bad not in result.output
    assert seen == []


def test_pause_and_resume_with_secret_values_from_a_file(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path
) -> None:
    seen = gateway(lambda request: httpx.Response(200, json={**SESSION, "state": "paused", "paused_at": 1.5}))
    runner = CliRunner()
    paused = runner.invoke(app, ["session", "pause", "ses_1", "--json"])
    assert paused.exit_code == 0, paused.output
    assert json.loads(paused.stdout)["state"] == "paused"
    values = tmp_path / "values.json"
    values.write_text(json.dumps({"API_TOKEN": "sk-value-never-printed"}))
    resumed = runner.invoke(app, ["session", "resume", "ses_1", "--secrets-file", str(values)])
    assert resumed.exit_code == 0, resumed.output
    assert "sk-value-never-printed" not in resumed.output
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/v1/sessions/ses_1/pause"),
        ("POST", "/v1/sessions/ses_1/resume"),
    ]
    assert json.loads(seen[1].content) == {"secrets": {"API_TOKEN": "sk-value-never-printed"}}
    values.write_text(json.dumps({"API_TOKEN": {"value": "x"}}))
    refused = runner.invoke(app, ["session", "resume", "ses_1", "--secrets-file", str(values)])
    assert refused.exit_code == 2 and '{"NAME": "value"}' in refused.output


def test_create_asks_for_an_idle_pause(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    seen = gateway(lambda request: httpx.Response(201, json=SESSION))
    result = CliRunner().invoke(app, ["session", "create", "--json", "--idle-action", "pause"])
    assert result.exit_code == 0, result.output
    assert json.loads(seen[0].content)["idle_action"] == "pause"
