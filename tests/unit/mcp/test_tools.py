"""The tools at the SDK's seam: their schemas and annotations as a client lists them, the message
each sends the gateway for its arguments, and every refusal as a tool error with Corral's code."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest
from mcp_types import ImageContent, TextContent

from corral.mcp import ANNOTATIONS

from .conftest import FakeGateway, call, connect, reply

S = "ses_0123456789abcdef"
PNG = base64.b64encode(b"\x89PNG fake").decode()
SHOT = {"media_type": "image/png", "width": 1280, "height": 800, "data": PNG}


async def test_every_tool_is_listed_with_its_annotations_and_a_described_schema(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert list(tools) == list(ANNOTATIONS)
        for name, tool in tools.items():
            assert tool.annotations == ANNOTATIONS[name]
            assert tool.description
            properties = tool.input_schema["properties"]
            assert all(spec.get("description") for spec in properties.values()), name
            assert "ctx" not in properties
            if name not in ("create_session", "list_sessions"):
                assert "session_id" in tool.input_schema["required"], name
        assert tools["click"].input_schema["required"] == ["session_id", "x", "y"]
        assert tools["exec"].input_schema["required"] == ["session_id", "command"]


def test_the_annotations_are_consistent() -> None:
    for name, hints in ANNOTATIONS.items():
        assert None not in (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint)
        if hints.read_only_hint:  # reading destroys nothing, and twice is the same as once
            assert not hints.destructive_hint and hints.idempotent_hint, name
    reading = {name for name, hints in ANNOTATIONS.items() if hints.read_only_hint}
    assert reading == {
        "list_sessions",
        "screenshot",
        "wait",
        "cursor_position",
        "list_tabs",
        "read_file",
        "audit_summary",
        "list_previews",
        "list_downloads",
        "read_download",
    }
    assert {name for name, hints in ANNOTATIONS.items() if hints.destructive_hint} == {
        "end_session",
        "pause_session",
        "click",
        "type_text",
        "press_key",
        "drag",
        "close_tab",
        "exec",
        "write_file",
        "run_code",
        "restart_code_context",
        "revoke_preview",
    }


# What each action answers (its result model's shape): the tools read the reply's result as it.
POSITION = {"x": 1, "y": 2}
RESULT_OF: dict[str, dict[str, Any]] = {
    **{tool: POSITION for tool in ("click", "move_mouse", "drag")},
    "type_text": {"typed": 6, "via": "x"},
    "scroll": {"clicks": 3, "direction": "down"},
    "navigate": {"url": "https://example.test/", "title": "", "status": 200},
}


@pytest.mark.parametrize(
    ("tool", "arguments", "action", "screenshot"),
    [
        (
            "click",
            {"x": 10, "y": 20},
            {"type": "click", "button": "left", "count": 1, "modifiers": [], "x": 10, "y": 20},
            True,
        ),
        (
            "click",
            {"x": 1, "y": 2, "button": "right", "count": 2, "screenshot": False},
            {"type": "click", "button": "right", "count": 2, "modifiers": [], "x": 1, "y": 2},
            False,
        ),
        ("type_text", {"text": "héllo\n"}, {"type": "type", "text": "héllo\n"}, True),
        ("press_key", {"key": "ctrl+a"}, {"type": "key", "keys": "ctrl+a"}, True),
        ("scroll", {"direction": "down"}, {"type": "scroll", "direction": "down", "clicks": 3}, True),
        (
            "scroll",
            {"direction": "up", "clicks": 5, "x": 3, "y": 4},
            {"type": "scroll", "direction": "up", "clicks": 5, "x": 3, "y": 4},
            True,
        ),
        ("move_mouse", {"x": 5, "y": 6}, {"type": "move", "x": 5, "y": 6}, False),
        (
            "drag",
            {"from_x": 1, "from_y": 2, "to_x": 3, "to_y": 4},
            {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 3, "y": 4}]},
            True,
        ),
        ("wait", {"ms": 250}, {"type": "wait", "ms": 250}, True),
        ("navigate", {"url": "https://example.test/"}, {"type": "navigate", "url": "https://example.test/"}, True),
    ],
)
async def test_an_action_tool_sends_its_native_action(
    fake: FakeGateway, tool: str, arguments: dict[str, Any], action: dict[str, Any], screenshot: bool
) -> None:
    async with connect(fake) as client:
        fake.answer = lambda request: reply(RESULT_OF.get(tool, {}), screenshot=SHOT)
        result = await call(client, tool, session_id=S, **arguments)
        assert not result.is_error
        assert [(r.method, r.url.path) for r in fake.sent] == [("POST", f"/v1/sessions/{S}/actions")]
        # A screenshot is taken once the screen settled, as the native wait_for: "stable".
        settled = {"wait_for": "stable"} if screenshot else {}
        assert fake.bodies() == [{"action": action, "screenshot": screenshot, **settled}]
        assert fake.sent[0].headers["authorization"] == "Bearer unit-key"
        # The screenshot the reply carries comes back as image content, after the text.
        assert isinstance(result.content[0], TextContent)
        assert [block.data for block in result.content if isinstance(block, ImageContent)] == [PNG]


@pytest.mark.parametrize(
    ("tool", "arguments", "action"),
    [
        ("cursor_position", {}, {"type": "cursor_position"}),
        ("list_tabs", {}, {"type": "tabs"}),
        ("new_tab", {}, {"type": "tab_new", "url": None}),
        ("switch_tab", {"tab": 2}, {"type": "tab_switch", "tab": 2}),
        ("switch_tab", {"tab": "t-1"}, {"type": "tab_switch", "tab": "t-1"}),
        ("close_tab", {}, {"type": "tab_close", "tab": None}),
        ("read_file", {"path": "a.txt"}, {"type": "file_read", "path": "a.txt", "offset": 0, "encoding": "base64"}),
        (
            "write_file",
            {"path": "a/b.txt", "content": "x"},
            {"type": "file_write", "path": "a/b.txt", "append": False, "make_dirs": True, "content": "x"},
        ),
        ("exec", {"command": "ls", "timeout_ms": 5}, {"type": "exec", "command": "ls", "timeout_ms": 5}),
    ],
)
async def test_a_tool_sends_its_action(
    fake: FakeGateway, tool: str, arguments: dict[str, Any], action: dict[str, Any]
) -> None:
    async with connect(fake) as client:
        await call(client, tool, session_id=S, **arguments)
        assert fake.bodies() == [{"action": action}]


async def test_the_screenshot_tool_looks_once_the_screen_settled(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        fake.answer = lambda request: reply({}, screenshot=SHOT)
        result = await call(client, "screenshot", session_id=S)
        assert fake.bodies() == [{"action": {"type": "screenshot", "format": "png"}, "wait_for": "stable"}]
        assert [block.data for block in result.content if isinstance(block, ImageContent)] == [PNG]


async def test_results_carry_the_reply_as_text_and_structured_content(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        tab = {"index": 0, "id": "t-1", "active": True, "url": "https://example.test/", "title": "Example"}
        fake.answer = lambda request: reply({"tabs": [tab]})
        tabs = await call(client, "list_tabs", session_id=S)
        assert tabs.structured_content == {"tabs": [tab]}
        assert isinstance(tabs.content[0], TextContent) and "Example" in tabs.content[0].text

        fake.answer = lambda request: reply({"exit_code": 3, "stdout": "out\n", "stderr": "", "duration_ms": 4.0})
        ran = await call(client, "exec", session_id=S, command="exit 3")
        assert not ran.is_error  # a command that ran and failed is an answer
        assert ran.structured_content is not None and ran.structured_content["exit_code"] == 3
        assert isinstance(ran.content[0], TextContent) and ran.content[0].text.startswith(
            "exit code 3\n--- stdout ---\nout"
        )

        fake.answer = lambda request: reply(screenshot=SHOT)
        shot = await call(client, "screenshot", session_id=S)
        assert shot.structured_content == {"width": 1280, "height": 800}
        assert [block.data for block in shot.content if isinstance(block, ImageContent)] == [PNG]

        content = {"content": base64.b64encode(b"\xff\x00").decode(), "encoding": "base64"}
        read = {"path": "/workspace/x.bin", "size": 2, "offset": 0, "length": 2, "eof": True, **content}
        fake.answer = lambda request: reply(read)
        binary = await call(client, "read_file", session_id=S, path="x.bin")
        assert binary.structured_content == {"path": "x.bin", "content": "/wA=", "encoding": "base64", "size": 2}


async def test_sessions_go_through_the_gateways_api_and_never_show_the_token(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        info = {"id": S, "state": "running", "token": "secret-token", "ws_url": "ws://gw.test/x"}
        fake.answer = lambda request: httpx.Response(201, json=info)
        created = await call(client, "create_session", allow=["example.test"], viewport_width=1024, viewport_height=768)
        assert created.structured_content == {"id": S, "state": "running", "ws_url": "ws://gw.test/x"}
        assert "secret-token" not in str(created.content)
        assert (fake.sent[0].method, fake.sent[0].url.path) == ("POST", "/v1/sessions")
        assert fake.bodies()[0] == {
            "allow": ["example.test"],
            "labels": {"via": "mcp"},
            "viewport": {"width": 1024, "height": 768},
        }

        fake.answer = lambda request: httpx.Response(200, json=[info])
        listed = await call(client, "list_sessions")
        assert listed.structured_content == {"sessions": [{"id": S, "state": "running", "ws_url": "ws://gw.test/x"}]}

        fake.answer = lambda request: httpx.Response(204)
        ended = await call(client, "end_session", session_id=S)
        assert ended.structured_content == {"id": S, "ended": True}
        assert (fake.sent[-1].method, fake.sent[-1].url.path) == ("DELETE", f"/v1/sessions/{S}")


AUDIT = (
    '{"seq":1,"time":1.0,"event":"block","decision":"deny","host":"evil.test","method":"GET","status":403}\n'
    '{"seq":2,"time":2.0,"event":"request","decision":"allow","host":"ok.test","method":"GET","status":200}\n'
)


async def test_the_audit_summary_is_the_clis(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        fake.answer = lambda request: httpx.Response(200, text=AUDIT)
        result = await call(client, "audit_summary", session_id=S)
        assert not result.is_error, result.content
        assert fake.sent[0].url.path == f"/v1/sessions/{S}/traffic"
        summary = result.structured_content or {}
        hosts = {row["host"]: row for row in summary["hosts"]}
        assert (hosts["evil.test"]["blocked"], hosts["ok.test"]["requests"]) == (1, 1)
        assert summary["total"]["host"] == "total"

        fake.answer = lambda request: httpx.Response(200, text="not json\n")
        assert error_of(await call(client, "audit_summary", session_id=S))["code"] == "audit_log_unreadable"


def error_of(result: Any) -> dict[str, Any]:
    assert result.is_error
    error: dict[str, Any] = result.structured_content["error"]
    assert result.content[0].text.startswith(f"{error['code']}: {error['message']}")
    return error


async def test_a_sandbox_refusal_is_a_tool_error_with_its_code(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        refusal = {
            "ok": False,
            "id": None,
            "error": {"code": "out_of_bounds", "message": "x is off", "field": "action.x"},
        }
        fake.answer = lambda request: httpx.Response(400, json=refusal)
        assert error_of(await call(client, "click", session_id=S, x=9999, y=1)) == refusal["error"]
        assert error_of(await call(client, "exec", session_id=S, command="x"))["code"] == "out_of_bounds"
        assert error_of(await call(client, "screenshot", session_id=S))["code"] == "out_of_bounds"
        # ...and the server goes on serving.
        fake.answer = lambda request: reply({"x": 1, "y": 2})
        assert not (await call(client, "cursor_position", session_id=S)).is_error


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        (401, "unauthorized", "that API key or token is not valid"),
        (403, "forbidden", "a session token only opens its own session"),
        (404, "not_found", "no session ses_x"),
    ],
)
async def test_a_gateway_refusal_is_a_tool_error_with_its_code(
    fake: FakeGateway, status: int, code: str, message: str
) -> None:
    async with connect(fake) as client:
        fake.answer = lambda request: httpx.Response(
            status, json={"ok": False, "error": {"code": code, "message": message}}
        )
        for tool, arguments in [
            ("create_session", {}),
            ("list_sessions", {}),
            ("end_session", {"session_id": S}),
            ("click", {"session_id": S, "x": 1, "y": 1}),
        ]:
            assert error_of(await call(client, tool, **arguments)) == {"code": code, "message": message}


async def test_a_gateway_that_does_not_answer_is_a_tool_error(fake: FakeGateway) -> None:
    async with connect(fake) as client:

        def down(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("connection refused", request=request)

        fake.answer = down
        error = error_of(await call(client, "screenshot", session_id=S))
        assert error["code"] == "http_error" and "connection refused" in error["message"]


async def test_arguments_off_the_schema_are_a_coded_tool_error_and_nothing_is_sent(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        result = await call(client, "click", session_id=S, x=-1, y="here")
        error = error_of(result)
        assert error["code"] == "invalid_request" and error["field"] == "x"
        assert error["message"] == (
            "x: Input should be greater than or equal to 0; "
            "y: Input should be a valid integer, unable to parse string as an integer"
        )
        assert [(p["argument"], p["problem"]) for p in error["problems"]] == [("x", "invalid"), ("y", "invalid")]
        assert error["problems"][0]["expected"] == (
            "an integer, >= 0 (required): Pixels from the screen's left edge, in the screenshot's coordinates."
        )
        assert "clickArguments" not in str(result.content) and "pydantic" not in str(result.content)
        assert fake.sent == []
        assert error_of(await call(client, "format_disk")) == {
            "code": "unknown_tool",
            "message": "Unknown tool: format_disk",
        }
        fake.answer = lambda request: reply({"x": 1, "y": 2})
        assert not (await call(client, "cursor_position", session_id=S)).is_error


async def test_a_wrong_argument_name_is_named_with_the_one_meant_and_what_the_tool_takes(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        result = await call(client, "press_key", session_id=S, keys="Return")
        error = error_of(result)
        assert error["code"] == "invalid_request"
        assert error["message"] == "press_key has no argument keys (did you mean key?); key is required"
        assert error["problems"] == [
            {
                "argument": "keys",
                "problem": "unknown",
                "detail": "press_key has no argument keys (did you mean key?)",
                "expected": "one of session_id, key, screenshot",
            },
            {
                "argument": "key",
                "problem": "missing",
                "detail": "key is required",
                "expected": error["problems"][1]["expected"],
            },
        ]
        assert error["problems"][1]["expected"].startswith("a string, length >= 1 (required): The key or key")
        text = result.content[0]
        assert isinstance(text, TextContent)
        assert text.text.splitlines()[:3] == [
            "invalid_request: press_key has no argument keys (did you mean key?); key is required",
            "press_key takes:",
            "- session_id: a string, length >= 1 (required): The session's id (ses_...), as create_session or "
            "list_sessions gives it.",
        ]
        assert "- screenshot: true or false (default true): Answer with a screenshot" in text.text
        assert fake.sent == []
        # An unknown name alone is refused too (the SDK would drop it and run the tool).
        extra = error_of(await call(client, "cursor_position", session_id=S, verbose=True))
        assert [(p["argument"], p["problem"]) for p in extra["problems"]] == [("verbose", "unknown")]
        assert fake.sent == []
        # A flood of stray arguments is answered in bounded text: the first problems and a count.
        flood = error_of(await call(client, "cursor_position", session_id=S, **{f"a{i}": 1 for i in range(500)}))
        assert len(flood["problems"]) == 20 and flood["message"].endswith("; and 480 more")
        assert len(flood["message"]) < 2_000
        fake.answer = lambda request: reply()
        assert not (await call(client, "press_key", session_id=S, key="Return")).is_error
        assert fake.bodies()[-1]["action"] == {"type": "key", "keys": "Return"}


async def test_descriptions_are_the_docstrings_without_their_indentation(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert tools["exec"].description == (
        "Run a command in the session as its agent user and answer its exit code, stdout and stderr.\n"
        "A non-zero exit code is an answer, not an error."
    )
    assert all("\n " not in (tool.description or "") for tool in tools.values())


async def test_audit_summary_says_who_may_read_it_as_the_gateway_decides(fake: FakeGateway) -> None:
    """gateway.routes.traffic.audit_log: the owner's API key, or the session's own token while it lives."""
    async with connect(fake) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    description = tools["audit_summary"].description or ""
    assert "owner's API key" in description and "its own token while it lives" in description


HANDED = {"by": "human:lnk_3kq9x0a1b2c4", "note": "logged in", "at": 1733240170.2, "left": False}


@pytest.mark.parametrize(
    ("arguments", "action"),
    [
        ({}, {"type": "control", "wait_ms": 0}),
        ({"wait_ms": 100_000}, {"type": "control", "wait_ms": 100_000}),
    ],
)
async def test_control_asks_the_lease_and_answers_the_hand_back(
    fake: FakeGateway, arguments: dict[str, Any], action: dict[str, Any]
) -> None:
    answer = {"holder": "agent", "since": 1.0, "help": None, "handed_back": HANDED}
    async with connect(fake) as client:
        fake.answer = lambda request: reply(answer)
        result = await call(client, "control", session_id=S, **arguments)
        assert fake.bodies() == [{"action": action}]
        assert not result.is_error and result.structured_content == answer
        assert isinstance(result.content[0], TextContent) and "logged in" in result.content[0].text
        assert (await call(client, "control", session_id=S, wait_ms=100_001)).is_error  # over the HTTP client's wait


async def test_request_control_sends_the_reason_and_waits_under_the_clients_timeout(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        fake.answer = lambda request: reply({"holder": "agent", "since": 1.0, "help": None, "handed_back": None})
        result = await call(client, "request_control", session_id=S, reason="solve the CAPTCHA")
        assert fake.bodies() == [
            {"action": {"type": "request_control", "reason": "solve the CAPTCHA", "wait_ms": 100_000}}
        ]
        assert not result.is_error and result.structured_content is not None
        assert result.structured_content["handed_back"] is None


async def test_a_refusal_by_the_lease_is_a_tool_error_and_a_hand_back_reaches_the_model_once(fake: FakeGateway) -> None:
    refused = {"code": "control_taken", "message": "control of the session is held by human:lnk_a", "holder": "x"}
    async with connect(fake) as client:
        fake.answer = lambda request: httpx.Response(409, json={"ok": False, "id": None, "error": refused})
        taken = await call(client, "click", session_id=S, x=1, y=2)
        assert taken.is_error and taken.structured_content is not None
        assert taken.structured_content["error"]["code"] == "control_taken"
        fake.answer = lambda request: reply({"x": 1, "y": 2}, control=HANDED)
        clicked = await call(client, "click", session_id=S, x=1, y=2, screenshot=False)
        assert not clicked.is_error and clicked.structured_content == {"x": 1, "y": 2, "control": HANDED}
        texts = [block.text for block in clicked.content if isinstance(block, TextContent)]
        assert texts[-1] == "human:lnk_3kq9x0a1b2c4 handed control back with a note: logged in"
