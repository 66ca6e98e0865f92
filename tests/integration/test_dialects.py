"""Anthropic's and OpenAI's computer-tool payloads, verbatim, against the real sandbox (with scaling)."""

from __future__ import annotations

import base64
import io

from PIL import Image

from corral.client import SandboxClient

from .conftest import await_json, await_title, center, find_color, open_page, screenshot_image
from .test_input import BUTTON_JS, BUTTON_PAGE, INPUT_JS, INPUT_PAGE

RED = (255, 0, 0)
BLUE = (0, 0, 255)
XGA = {"width": 1024, "height": 640}  # what the model is told the screen is; the real one is 1280x800


def _to_display(x: int, y: int) -> list[int]:
    return [round(x * 1024 / 1280), round(y * 640 / 800)]


def test_anthropic_left_click_scaled(client: SandboxClient) -> None:
    open_page(client, BUTTON_PAGE, BUTTON_JS)
    x, y = center(find_color(screenshot_image(client), RED))
    reply = client.request({"anthropic": {"action": "left_click", "coordinate": _to_display(x, y)}, "display": XGA})
    assert reply["ok"], reply
    assert await_json(client)["n"] == 1
    content = reply["result"]["tool_result_content"]
    assert [block["type"] for block in content] == ["image"]
    source = content[0]["source"]
    assert source["type"] == "base64" and source["media_type"] == "image/png"
    assert Image.open(io.BytesIO(base64.b64decode(source["data"]))).size == (1024, 640)
    assert reply["screenshot"]["settled"] in (True, False) and "data" not in reply["screenshot"]


def test_anthropic_modifier_as_text_and_as_key(client: SandboxClient) -> None:
    open_page(client, BUTTON_PAGE, BUTTON_JS)
    x, y = center(find_color(screenshot_image(client), RED))
    client.request({"anthropic": {"action": "left_click", "coordinate": [x, y], "text": "shift"}, "screenshot": False})
    assert await_json(client, lambda s: s["n"] == 1)["shift"] is True
    client.request({"anthropic": {"action": "left_click", "coordinate": [x, y], "key": "ctrl"}, "screenshot": False})
    state = await_json(client, lambda s: s["n"] == 2)
    assert state["ctrl"] is True and state["shift"] is False


def test_anthropic_type_key_cursor_and_zoom(client: SandboxClient) -> None:
    open_page(client, INPUT_PAGE, INPUT_JS)
    x, y = center(find_color(screenshot_image(client), BLUE))
    assert client.request({"anthropic": {"action": "triple_click", "coordinate": [x, y]}})["ok"]
    assert client.request({"anthropic": {"action": "type", "text": "héllo"}})["ok"]
    assert client.request({"anthropic": {"action": "key", "text": "BackSpace"}})["ok"]
    assert await_title(client, "héll") == "héll"
    reply = client.request({"anthropic": {"action": "cursor_position"}, "display": XGA})
    dx, dy = _to_display(x, y)
    assert reply["result"]["tool_result_content"] == [{"type": "text", "text": f"X={dx},Y={dy}"}]
    reply = client.request({"anthropic": {"action": "zoom", "region": [0, 0, 512, 320]}, "display": XGA})
    block = reply["result"]["tool_result_content"][0]
    assert Image.open(io.BytesIO(base64.b64decode(block["source"]["data"]))).size == (640, 400)  # full resolution


def test_anthropic_scroll_and_wait(client: SandboxClient) -> None:
    js = "addEventListener('scroll', () => { document.title = String(Math.round(scrollY)); });"
    open_page(client, '<div style="height:5000px">tall</div>', js)
    reply = client.request(
        {"anthropic": {"action": "scroll", "coordinate": [640, 400], "scroll_direction": "down", "scroll_amount": 3}}
    )
    assert reply["ok"], reply
    assert int(await_title(client)) > 0
    reply = client.request({"anthropic": {"action": "wait", "duration": 0.1}})
    assert reply["ok"] and reply["result"]["tool_result_content"][0]["type"] == "image"


def test_anthropic_error_names_the_input_field(client: SandboxClient) -> None:
    reply = client.request({"anthropic": {"action": "left_click", "coordinate": [5000, 10]}})
    assert reply["ok"] is False
    assert reply["error"]["code"] == "out_of_bounds" and reply["error"]["field"] == "anthropic.coordinate"
    reply = client.request({"anthropic": {"action": "key", "text": "ctrl+nosuchkey"}})
    assert reply["error"]["code"] == "unknown_key" and reply["error"]["field"] == "anthropic.text"


def test_openai_batch_click_then_type(client: SandboxClient) -> None:
    open_page(client, INPUT_PAGE, INPUT_JS)
    x, y = center(find_color(screenshot_image(client), BLUE))
    batch = [
        {"type": "click", "button": "left", "x": x, "y": y},
        {"type": "type", "text": "from openai"},
        {"type": "keypress", "keys": ["CTRL", "A"]},
        {"type": "keypress", "keys": ["BACKSPACE"]},
        {"type": "type", "text": "done"},
    ]
    reply = client.request({"openai": batch})
    assert reply["ok"], reply
    assert await_title(client, "done") == "done"
    output = reply["result"]["output"]
    assert output["type"] == "computer_screenshot"
    assert output["image_url"].startswith("data:image/png;base64,")
    png = base64.b64decode(output["image_url"].split(",", 1)[1])
    assert Image.open(io.BytesIO(png)).size == (1280, 800)


def test_openai_scroll_pixels_and_modifier_click(client: SandboxClient) -> None:
    js = "addEventListener('scroll', () => { document.title = String(Math.round(scrollY)); });"
    open_page(client, '<div style="height:5000px">tall</div>', js)
    reply = client.request({"openai": {"type": "scroll", "x": 640, "y": 400, "scroll_x": 0, "scroll_y": 250}})
    assert reply["ok"], reply
    assert await_title(client, "250") == "250"
    open_page(client, BUTTON_PAGE, BUTTON_JS)
    x, y = center(find_color(screenshot_image(client), RED))
    reply = client.request({"openai": {"type": "double_click", "x": x, "y": y, "keys": ["SHIFT"]}})
    assert reply["ok"], reply
    state = await_json(client, lambda s: s["n"] == 2)
    assert state["detail"] == 2 and state["shift"] is True


def test_openai_error_in_a_batch_names_the_item(client: SandboxClient) -> None:
    reply = client.request({"openai": [{"type": "move", "x": 1, "y": 1}, {"type": "click", "x": 1}]})
    assert reply["ok"] is False
    assert reply["error"]["code"] == "missing_field" and reply["error"]["field"] == "openai[1].y"
