"""Every action in the union has its case in Desktop.run (mypy proves it through ``assert_never``; this
runs each one through stand-in parts) and reaches the part that carries it out."""

from __future__ import annotations

from typing import Any

import pytest

from corral.protocol import ACTION_TYPES
from corral.protocol.actions import ACTIONS
from corral.protocol.plan import ActionResult, After
from corral.sandbox.display import clipboard

from ..protocol.test_actions import MINIMAL
from .desktop_fake import IMAGE, Parts, fake_desktop, fake_tools

# The minimal examples, without the waits (a wait's default is a second; a drag is paced; a help
# request waits five minutes for a human by default).
EXAMPLES = {
    **MINIMAL,
    "wait": {"ms": 0},
    "drag": {**MINIMAL["drag"], "step_ms": 0},
    "request_control": {**MINIMAL["request_control"], "wait_ms": 0},
}

# Which part carries out each action (the clipboard is xclip, stood in for below).
PART = {
    "screenshot": "screen",
    "zoom": "screen",
    "click": "input",
    "mouse_down": "input",
    "mouse_up": "input",
    "move": "input",
    "drag": "input",
    "scroll": "input",
    "type": "input",
    "key": "input",
    "wait": None,
    "cursor_position": None,
    "clipboard_get": "clipboard",
    "clipboard_set": "clipboard",
    "navigate": "browser",
    "back": "browser",
    "forward": "browser",
    "reload": "browser",
    "page_info": "browser",
    "tabs": "browser",
    "tab_new": "browser",
    "tab_switch": "browser",
    "tab_close": "browser",
    "file_read": "files",
    "file_write": "files",
    "file_list": "files",
    "file_stat": "files",
    "file_remove": "files",
    "file_move": "files",
    "exec": "processes",
    "process_list": "processes",
    "process_wait": "processes",
    "process_kill": "processes",
    "process_write": "processes",
    "process_output": "processes",
    "process_resize": "processes",
    "edit": "editor",
    "apply_patch": "patcher",
    "file_glob": "search",
    "file_grep": "search",
    "secrets": None,  # the desktop's placeholders, in memory
    "shell": "shell",
    "run_code": "code",
    "list_code_contexts": "code",
    "restart_code_context": "code",
    "remove_code_context": "code",
    "control": None,  # the desktop's lease, in memory
    "request_control": None,
}


def test_every_registered_action_has_an_example_and_a_part() -> None:
    assert set(EXAMPLES) == set(PART) == set(ACTION_TYPES) == set(ACTIONS)


@pytest.mark.parametrize("kind", ACTION_TYPES)
async def test_every_action_in_the_union_has_a_handler(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = Parts()

    async def get_text(display: str) -> str:
        parts.log("clipboard", "get_text", display)
        return "copied"

    async def set_text(display: str, text: str) -> None:
        parts.log("clipboard", "set_text", display, text)

    monkeypatch.setattr(clipboard, "get_text", get_text)
    monkeypatch.setattr(clipboard, "set_text", set_text)
    action: Any = ACTIONS[kind].model_validate({"type": kind, **EXAMPLES[kind]})
    result = await fake_desktop(parts).run(action, After())
    assert isinstance(result, ActionResult)
    assert (result.image is IMAGE) == (kind in ("screenshot", "zoom"))
    touched = {part for part, _, _ in parts.calls}
    assert touched == ({PART[kind]} if PART[kind] else set()), parts.calls


@pytest.mark.parametrize("kind", ["click", "mouse_down", "mouse_up", "drag", "scroll", "type", "key"])
async def test_input_that_may_load_a_page_asks_for_the_browser_driver(kind: str) -> None:
    # The driver stops while the session is idle; input brings it back (in the background) so the
    # settles after it see the page's requests again.
    parts = Parts()
    action: Any = ACTIONS[kind].model_validate({"type": kind, **EXAMPLES[kind]})
    await fake_desktop(parts).run(action, After())
    assert parts.wanted == 1


@pytest.mark.parametrize("kind", ["screenshot", "cursor_position", "wait", "file_read", "exec"])
async def test_looking_and_commands_leave_the_browser_driver_stopped(kind: str) -> None:
    # A pool of idle sessions answering screenshots (the density bench) must not start a driver each.
    parts = Parts()
    action: Any = ACTIONS[kind].model_validate({"type": kind, **EXAMPLES[kind]})
    await fake_desktop(parts).run(action, After())
    assert parts.wanted == 0


async def test_the_agents_tools_are_built_by_the_first_tool_action_once() -> None:
    # Their modules are off a cold start's path to its first screenshot (docs/design/0470).
    parts = Parts()
    built: list[str] = []

    def tools() -> Any:
        built.append("tools")
        return fake_tools(parts)

    desktop = fake_desktop(parts, tools=tools)
    screenshot: Any = ACTIONS["screenshot"].model_validate({"type": "screenshot"})
    await desktop.run(screenshot, After())
    assert built == []
    for kind in ("edit", "file_glob", "shell"):
        action: Any = ACTIONS[kind].model_validate({"type": kind, **EXAMPLES[kind]})
        await desktop.run(action, After())
    assert built == ["tools"]
    assert [part for part, _, _ in parts.calls if part != "screen"] == ["editor", "search", "shell"]
