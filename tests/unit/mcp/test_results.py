"""Replies and refusals as MCP tool results (pure)."""

from __future__ import annotations

from mcp_types import ImageContent, TextContent

from corral.errors import ActionFailed, GatewayError, NoSuchFile
from corral.mcp import results
from corral.protocol import results as r


def test_data_is_text_and_structured_content() -> None:
    result = results.data({"a": 1})
    assert result.structured_content == {"a": 1} and not result.is_error
    assert isinstance(result.content[0], TextContent) and '"a": 1' in result.content[0].text
    assert results.data({"a": 1}, "one").content[0] == TextContent(type="text", text="one")


def test_an_action_says_what_it_did_and_shows_the_screen_after() -> None:
    reply = {"ok": True, "screenshot": {"media_type": "image/jpeg", "width": 2, "height": 1, "data": "AAAA"}}
    result = results.with_screenshot(r.Done(), "clicked", reply)
    assert result.content == [
        TextContent(type="text", text="clicked"),
        ImageContent(type="image", data="AAAA", mime_type="image/jpeg"),
    ]
    with_result = results.with_screenshot(r.Position(x=1, y=2), "where", {"ok": True})
    assert with_result.content == [TextContent(type="text", text='where: {"x": 1, "y": 2}')]


def test_refusals_keep_corrals_code_message_and_field() -> None:
    failed = ActionFailed({"code": "invalid_field", "message": "bad", "field": "action.x"})
    assert results.refusal(failed).structured_content == {
        "error": {"code": "invalid_field", "message": "bad", "field": "action.x"}
    }
    assert results.refusal(failed).content[0] == TextContent(type="text", text="invalid_field: bad (field action.x)")
    gateway = GatewayError(403, {"error": {"code": "forbidden", "message": "not yours: really"}})
    assert results.refusal(gateway).structured_content == {
        "error": {"code": "forbidden", "message": "not yours: really"}
    }
    local = results.refusal(NoSuchFile("no /x"))
    assert local.is_error and local.structured_content == {"error": {"code": "no_such_file", "message": "no /x"}}
    assert results.reply_error({"ok": False}).structured_content == {"error": {"code": "internal", "message": ""}}


def test_the_sdks_own_tool_errors_get_corrals_code() -> None:
    def wire(text: str) -> dict[str, object]:
        return {"content": [{"type": "text", "text": text}], "isError": True}

    bad = results.coded_sdk_refusal(wire("Error executing tool click: 1 validation error for clickArguments"), "click")
    assert bad["structuredContent"] == {
        "error": {"code": "invalid_request", "message": "1 validation error for clickArguments"}
    }
    assert bad["content"] == [{"type": "text", "text": "invalid_request: 1 validation error for clickArguments"}]
    unknown = results.coded_sdk_refusal(wire("Unknown tool: nope"), "nope")
    assert unknown["structuredContent"] == {"error": {"code": "unknown_tool", "message": "Unknown tool: nope"}}
    crash = results.coded_sdk_refusal(wire("Error executing tool exec"), "exec")
    assert crash["structuredContent"] == {"error": {"code": "internal", "message": "exec failed; see the server's log"}}
    # The tools' own errors and results that are no errors pass as they are.
    own = {**wire("forbidden: no"), "structuredContent": {"error": {"code": "forbidden", "message": "no"}}}
    assert results.coded_sdk_refusal(own, "click") == own
    fine = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    assert results.coded_sdk_refusal(fine, "click") == fine
