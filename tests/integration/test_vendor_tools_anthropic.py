"""Anthropic's tools verbatim through the real gateway and a real sandbox: ``{"anthropic": <tool_use
block>}`` in, a complete ``tool_result`` out (held to ``BetaToolResultBlockParam``), success and every
error path. The computer (bare input and block), the computer toolset's members, bash_20250124, the
text editors (20250728/20250429 and 20250124) and agent_toolset_20260401's tools, on one session."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral.sdk import Sandbox

from .conftest import await_json, await_title, center, find_color, open_page, screenshot_image
from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway
from .test_input import BUTTON_JS, BUTTON_PAGE
from .vendor_fixtures import (
    BLUE,
    INPUT_JS,
    INPUT_PAGE,
    RED,
    SCREEN,
    cat,
    image_of,
    member,
    over_http,
    text_of,
    tool_result,
    tool_use,
)

pytestmark = pytest.mark.usefixtures("desktop_image")

NEW_EDITOR = "str_replace_based_edit_tool"  # text_editor_20250728 and _20250429: no undo_edit
OLD_EDITOR = "str_replace_editor"  # text_editor_20250124


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-vendor-a", egress=False) as running:
        yield running


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sandbox:
        yield sandbox


def run(sb: Sandbox, block: dict[str, Any], *, ok: bool = True, **envelope: Any) -> dict[str, Any]:
    """One tool_use block over the WebSocket (the client numbers the request); its checked tool_result."""
    return tool_result(sb.request({"anthropic": block, **envelope}), block, ok=ok)


def failed(sb: Sandbox, block: dict[str, Any], code: str) -> dict[str, Any]:
    """A tool_use block that must fail with ``code``: the reply, its is_error tool_result checked."""
    reply = sb.request({"anthropic": block})
    result = tool_result(reply, block, ok=False)
    assert reply["error"]["code"] == code, reply["error"]
    assert reply["error"]["message"] in text_of(result), result  # the model reads Corral's message
    return reply


def bash(sb: Sandbox, command: str, **more: Any) -> str:
    return text_of(run(sb, tool_use("bash", {"command": command, **more})))


def edit(tool: str, **tool_input: Any) -> dict[str, Any]:
    return tool_use(tool, tool_input)


# -- the computer ------------------------------------------------------------------------------------------


def test_the_bare_computer_input_keeps_its_reply(sb: Sandbox) -> None:
    sb.act({"type": "move", "x": 11, "y": 22})
    reply = sb.request({"anthropic": {"action": "cursor_position"}})
    assert reply["ok"] and "tool_result" not in reply["result"], reply
    assert reply["result"]["tool_result_content"] == [{"type": "text", "text": "X=11,Y=22"}]


def test_the_computer_tool_use_block_answers_with_its_tool_result(sb: Sandbox) -> None:
    shot = run(sb, tool_use("computer", {"action": "screenshot"}))
    assert image_of(shot).size == SCREEN
    run(sb, tool_use("computer", {"action": "mouse_move", "coordinate": [40, 50]}))
    moved = run(sb, tool_use("computer", {"action": "cursor_position"}))
    assert text_of(moved) == "X=40,Y=50"
    # Scaled for the model as the bare input is: the display it was told of.
    scaled = run(sb, tool_use("computer", {"action": "screenshot"}), display={"width": 1024, "height": 640})
    assert image_of(scaled).size == (1024, 640)


def test_the_toolset_pointer_members(sb: Sandbox) -> None:
    open_page(sb, BUTTON_PAGE, BUTTON_JS)
    x, y = center(find_color(screenshot_image(sb), RED))
    assert image_of(run(sb, member("left_click", coordinate=[x, y], text="shift"))).size == SCREEN
    state = await_json(sb, lambda s: s["n"] == 1)
    assert state["shift"] is True and state["detail"] == 1
    run(sb, member("double_click", coordinate=[x, y]))
    assert await_json(sb, lambda s: s["detail"] == 2)["detail"] == 2
    open_page(sb, BUTTON_PAGE, BUTTON_JS)  # a fresh page: no click count carried over from the double
    run(sb, member("triple_click", coordinate=[x, y]))
    assert await_json(sb, lambda s: s["detail"] == 3)["detail"] == 3
    run(sb, member("right_click", coordinate=[x, y]))
    assert await_title(sb, "context") == "context"
    run(sb, member("middle_click", coordinate=[x, y]))
    assert await_title(sb, "middle") == "middle"
    run(sb, member("mouse_move", coordinate=[x + 3, y + 4]))
    assert text_of(run(sb, member("cursor_position"))) == f"X={x + 3},Y={y + 4}"
    run(sb, member("left_mouse_down"))
    run(sb, member("left_mouse_up"))
    run(sb, member("left_click_drag", start_coordinate=[10, 10], coordinate=[60, 70]))
    assert text_of(run(sb, member("cursor_position"))) == "X=60,Y=70"
    run(sb, member("scroll", coordinate=[640, 400], scroll_direction="down", scroll_amount=2))
    run(sb, member("left_click"))  # no coordinate: where the cursor is


def test_the_toolset_keyboard_members(sb: Sandbox) -> None:
    open_page(sb, INPUT_PAGE, INPUT_JS)
    x, y = center(find_color(screenshot_image(sb), BLUE))
    run(sb, member("left_click", coordinate=[x, y]))
    run(sb, member("type", text="héllo"))
    run(sb, member("key", text="BackSpace", repeat=2))
    assert await_title(sb, "hél") == "hél"
    run(sb, member("hold_key", text="shift", duration=1))
    run(sb, member("key", text="ctrl+a"))
    run(sb, member("key", text="Delete"))
    run(sb, member("type", text="done"))
    assert await_title(sb, "done") == "done"


def test_the_toolset_screenshot_wait_and_zoom(sb: Sandbox) -> None:
    assert image_of(run(sb, member("screenshot"))).size == SCREEN
    started = time.monotonic()
    assert image_of(run(sb, member("wait", duration=1))).size == SCREEN
    assert time.monotonic() - started >= 1
    # A quarter of the screen's width and height: scaled up to fill the display (aspect kept).
    zoomed = image_of(run(sb, member("zoom", region=[0, 0, 320, 200])))
    assert zoomed.size == SCREEN
    wide = image_of(run(sb, member("zoom", region=[100, 100, 420, 180])))  # 4:1
    assert wide.width > 320 and abs(wide.width / wide.height - 4) < 0.05, wide.size


# -- bash_20250124 ---------------------------------------------------------------------------------------


def test_bash_keeps_its_state_between_calls(sb: Sandbox) -> None:
    assert bash(sb, "mkdir -p /tmp/e2e-bash && cd /tmp/e2e-bash && export CORRAL_E2E=kept") == ""
    assert bash(sb, "pwd; echo $CORRAL_E2E; id -un").split() == ["/tmp/e2e-bash", "kept", "agent"]
    # A non-zero exit is a result, not a failure; a command that wrote to stderr is an is_error result
    # (the reference bash tool's marking), its stdout first, then its stderr.
    block = tool_use("bash", {"command": "echo before; ls /no/such/dir; echo after"})
    out = text_of(tool_result(sb.request({"anthropic": block}), block, is_error=True))
    assert out.startswith("before\nafter\n") and "No such file or directory" in out
    assert "kept" in bash(sb, "(exit 3); echo $CORRAL_E2E")


def test_bash_restart_starts_a_fresh_shell(sb: Sandbox) -> None:
    bash(sb, "cd /tmp && export CORRAL_E2E_RESTART=old")
    restarted = run(sb, tool_use("bash", {"restart": True}))
    assert text_of(restarted) == "tool has been restarted."
    assert bash(sb, 'pwd; echo "[$CORRAL_E2E_RESTART]"').split() == ["/workspace", "[]"]


def test_bash_output_is_cut_with_a_note(sb: Sandbox) -> None:
    out = bash(sb, "head -c 100000 /dev/zero | tr '\\0' x")
    assert "x" * 1000 in out and len(out) < 100_000
    assert "<response clipped>" in out, out[-400:]


def test_a_hung_command_times_out_and_the_next_call_works(sb: Sandbox, runtime: DockerHarness) -> None:
    bash(sb, "cd /tmp && export CORRAL_E2E_HUNG=set")
    block = tool_use("bash", {"command": "sleep 600 & sleep 601", "timeout_ms": 1500})  # agent toolset's bash
    started = time.monotonic()
    reply = failed(sb, block, "timeout")
    assert time.monotonic() - started < 30
    assert "restart" in reply["error"]["message"], reply["error"]
    # The shell came back fresh, and the hung tree is gone.
    assert bash(sb, 'pwd; echo "[$CORRAL_E2E_HUNG]"').split() == ["/workspace", "[]"]
    code, out = runtime.exec(sb.container, ["pgrep", "-f", "sleep 60[01]"], user="root")
    assert code == 1, out


def test_a_running_bash_call_does_not_hold_up_the_computer(sb: Sandbox) -> None:
    """The tools run apart from the desktop: a screenshot answers while a command runs."""
    done: list[str] = []
    slow = threading.Thread(target=lambda: done.append(bash(sb, "sleep 3; echo slow-done")))
    started = time.monotonic()
    slow.start()
    try:
        time.sleep(0.3)  # the command is running
        assert image_of(run(sb, member("screenshot"))).size == SCREEN
        assert time.monotonic() - started < 2.5 and not done
    finally:
        slow.join(30)
    assert done == ["slow-done\n"]


# -- the text editors ------------------------------------------------------------------------------------

SOURCE = "one\ntwo\nthree\ntwo\n"


@pytest.mark.parametrize("tool", [NEW_EDITOR, OLD_EDITOR])
def test_the_editor_view_and_create(sb: Sandbox, tool: str) -> None:
    folder = f"/workspace/ed-{tool}"
    path = f"{folder}/a.txt"
    made = run(sb, edit(tool, command="create", path=path, file_text=SOURCE))
    assert text_of(made) == f"File created successfully at: {path}"
    assert cat(sb, path) == SOURCE
    failed(sb, edit(tool, command="create", path=path, file_text="x"), "file_exists")
    viewed = text_of(run(sb, edit(tool, command="view", path=path)))
    numbered = "".join(f"{n:6}\t{line}\n" for n, line in enumerate(SOURCE.split("\n"), 1))
    assert viewed == f"Here's the result of running `cat -n` on {path}:\n{numbered}", viewed
    ranged = text_of(run(sb, edit(tool, command="view", path=path, view_range=[2, -1])))
    assert f"{2:6}\ttwo\n" in ranged and f"{4:6}\ttwo\n" in ranged and "\tone\n" not in ranged
    if tool == NEW_EDITOR:  # text_editor_20250728's max_characters: the view cut to it
        cut = text_of(run(sb, edit(tool, command="view", path=path, max_characters=6)))
        assert f"{1:6}\tone" in cut and "three" not in cut, cut
    ranged = text_of(run(sb, edit(tool, command="view", path=path, view_range=[2, 3])))
    assert f"{3:6}\tthree" in ranged and f"{4:6}" not in ranged
    run(sb, tool_use("bash", {"command": f"mkdir -p {folder}/sub/deeper/deepest && touch {folder}/.hidden"}))
    listing = text_of(run(sb, edit(tool, command="view", path=folder)))
    assert "files and directories up to 2 levels deep" in listing and f"{folder}/a.txt" in listing
    assert f"{folder}/sub/deeper" in listing and "deepest" not in listing and ".hidden" not in listing
    failed(sb, edit(tool, command="view", path=f"{folder}/missing.txt"), "no_such_file")
    relative = failed(sb, edit(tool, command="view", path="a.txt"), "invalid_field")
    assert "not an absolute path" in relative["error"]["message"]


@pytest.mark.parametrize("tool", [NEW_EDITOR, OLD_EDITOR])
def test_the_editor_str_replace_and_insert(sb: Sandbox, tool: str) -> None:
    path = f"/workspace/ed-{tool}-replace.txt"
    sb.files.write(path, SOURCE)
    none = failed(sb, edit(tool, command="str_replace", path=path, old_str="four", new_str="4"), "no_match")
    message = none["error"]["message"]
    assert message == f"No replacement was performed, old_str `four` did not appear verbatim in {path}.", message
    several = failed(sb, edit(tool, command="str_replace", path=path, old_str="two", new_str="2"), "multiple_matches")
    assert "Multiple occurrences of old_str `two` in lines [2, 4]" in several["error"]["message"]
    assert cat(sb, path) == SOURCE  # nothing changed by either
    once = text_of(run(sb, edit(tool, command="str_replace", path=path, old_str="three", new_str="3")))
    assert f"The file {path} has been edited." in once and f"{3:6}\t3" in once
    assert cat(sb, path) == "one\ntwo\n3\ntwo\n"
    inserted = text_of(run(sb, edit(tool, command="insert", path=path, insert_line=1, new_str="1.5")))
    assert f"The file {path} has been edited." in inserted
    run(sb, edit(tool, command="insert", path=path, insert_line=0, insert_text="zero"))  # what models send
    assert cat(sb, path) == "zero\none\n1.5\ntwo\n3\ntwo\n"


def test_undo_edit_on_text_editor_20250124(sb: Sandbox) -> None:
    path = "/workspace/undo-old.txt"
    run(sb, edit(OLD_EDITOR, command="create", path=path, file_text=SOURCE))
    run(sb, edit(OLD_EDITOR, command="str_replace", path=path, old_str="one", new_str="1"))
    run(sb, edit(OLD_EDITOR, command="insert", path=path, insert_line=4, new_str="five"))
    undone = text_of(run(sb, edit(OLD_EDITOR, command="undo_edit", path=path)))
    assert f"Last edit to {path} undone successfully." in undone
    assert cat(sb, path) == "1\ntwo\nthree\ntwo\n"
    run(sb, edit(OLD_EDITOR, command="undo_edit", path=path))
    assert cat(sb, path) == SOURCE
    sb.files.write("/workspace/never-edited.txt", "as written\n")
    nothing = failed(sb, edit(OLD_EDITOR, command="undo_edit", path="/workspace/never-edited.txt"), "nothing_to_undo")
    assert nothing["error"]["message"] == "No edit history found for /workspace/never-edited.txt.", nothing["error"]


def test_undo_edit_is_refused_on_the_newer_editors(sb: Sandbox) -> None:
    path = "/workspace/undo-new.txt"
    run(sb, edit(NEW_EDITOR, command="create", path=path, file_text=SOURCE))
    run(sb, edit(NEW_EDITOR, command="str_replace", path=path, old_str="one", new_str="1"))
    reply = sb.request({"anthropic": (block := edit(NEW_EDITOR, command="undo_edit", path=path))})
    result = tool_result(reply, block, ok=False)
    assert reply["error"]["code"] in ("invalid_field", "unsupported"), reply["error"]
    assert "undo_edit" in text_of(result)
    assert cat(sb, path) == "1\ntwo\nthree\ntwo\n"


# -- agent_toolset_20260401 ------------------------------------------------------------------------------


def test_the_agent_toolset_write_read_edit(sb: Sandbox) -> None:
    written = run(sb, tool_use("write", {"file_path": "agent/deep/notes.txt", "content": "alpha\nbeta\nalpha\n"}))
    assert written["content"] and cat(sb, "/workspace/agent/deep/notes.txt") == "alpha\nbeta\nalpha\n"
    run(sb, tool_use("write", {"file_path": "/workspace/agent/deep/notes.txt", "content": "alpha\nbeta\nalpha\n"}))
    read = text_of(run(sb, tool_use("read", {"file_path": "agent/deep/notes.txt"}, toolset_name="agent_toolset")))
    assert f"{1:6}\talpha" in read and f"{3:6}\talpha" in read
    tail = text_of(run(sb, tool_use("read", {"file_path": "agent/deep/notes.txt", "view_range": [2, 0]})))
    assert f"{2:6}\tbeta" in tail and f"{1:6}\talpha" not in tail
    failed(
        sb,
        tool_use("edit", {"file_path": "agent/deep/notes.txt", "old_string": "alpha", "new_string": "A"}),
        "multiple_matches",
    )
    every = {"file_path": "agent/deep/notes.txt", "old_string": "alpha", "new_string": "A", "replace_all": True}
    run(sb, tool_use("edit", every))
    assert cat(sb, "/workspace/agent/deep/notes.txt") == "A\nbeta\nA\n"
    failed(sb, tool_use("read", {"file_path": "agent/none.txt"}), "no_such_file")


def test_the_agent_toolset_glob_grep_and_bash(sb: Sandbox) -> None:
    sb.files.write("/workspace/found/one.py", "import os\nprint('needle')\n", make_dirs=True)
    sb.files.write("/workspace/found/sub/two.py", "NEEDLE = 2\n", make_dirs=True)
    sb.files.write("/workspace/found/three.txt", "needle in text\n", make_dirs=True)
    globbed = text_of(run(sb, tool_use("glob", {"pattern": "**/*.py", "path": "found"})))
    assert "/workspace/found/one.py" in globbed and "/workspace/found/sub/two.py" in globbed
    assert "three.txt" not in globbed
    grepped = text_of(run(sb, tool_use("grep", {"pattern": "ne+dle", "path": "/workspace/found"})))
    assert "one.py" in grepped and "three.txt" in grepped and "two.py" not in grepped
    failed(sb, tool_use("grep", {"pattern": "(unclosed", "path": "found"}), "invalid_field")
    assert text_of(run(sb, tool_use("bash", {"command": "echo agent-bash", "timeout_ms": 5000}))) == "agent-bash\n"


# -- bad input -------------------------------------------------------------------------------------------


def _still_works(sb: Sandbox) -> None:
    assert bash(sb, "echo still-here") == "still-here\n"


def test_an_unserved_tool_name_is_unknown_tool(sb: Sandbox) -> None:
    failed(sb, tool_use("web_search", {"query": "corral"}), "unknown_tool")
    # A toolset member's name without toolset_name "computer" is not the computer's.
    failed(sb, tool_use("left_click", {"coordinate": [1, 1]}), "unknown_tool")
    _still_works(sb)


def test_a_toolset_member_with_wrong_input(sb: Sandbox) -> None:
    reply = failed(sb, member("left_click", coordinate="here"), "invalid_field")
    assert reply["error"]["field"].startswith("anthropic"), reply["error"]
    failed(sb, member("key"), "missing_field")
    failed(sb, member("left_click", coordinate=[99_999, 1]), "out_of_bounds")
    failed(sb, member("zoom", region=[0, 0, 5]), "missing_field")
    _still_works(sb)


def test_a_block_without_an_id_gets_only_the_error(sb: Sandbox) -> None:
    block = {"type": "tool_use", "name": "bash", "input": {"command": "touch /workspace/no-id"}}
    reply = sb.request({"anthropic": block})
    assert reply["ok"] is False and "result" not in reply, reply
    assert (reply["error"]["code"], reply["error"]["field"]) == ("missing_field", "anthropic.id"), reply["error"]
    reply = sb.request({"anthropic": {**block, "id": 5}})  # an id, but not a string: no tool_result either
    assert reply["ok"] is False and "result" not in reply, reply
    assert (reply["error"]["code"], reply["error"]["field"]) == ("invalid_field", "anthropic.id"), reply["error"]
    assert sb.exec("test -e /workspace/no-id").exit_code == 1
    _still_works(sb)


def test_a_non_dict_input_is_an_is_error_tool_result(sb: Sandbox) -> None:
    reply = failed(sb, tool_use("bash", "echo hi"), "invalid_field")
    assert reply["error"]["field"].startswith("anthropic"), reply["error"]
    failed(sb, tool_use(OLD_EDITOR, {"command": "fly", "path": "/workspace"}), "invalid_field")
    _still_works(sb)


def test_the_same_blocks_over_http(gw: RunningGateway, sb: Sandbox) -> None:
    block = tool_use("bash", {"command": "echo over-http"})
    assert text_of(tool_result(over_http(gw, sb, {"anthropic": block}), block)) == "over-http\n"
    bad = tool_use("web_search", {"query": "x"})
    reply = over_http(gw, sb, {"anthropic": bad})
    assert reply["error"]["code"] == "unknown_tool" and tool_result(reply, bad, ok=False)["is_error"] is True
    _still_works(sb)


def test_a_tools_error_names_the_field_of_the_block(sb: Sandbox) -> None:
    """An error of a tool that runs apart from the desktop (shell, edit, apply_patch) names the block's
    own field (``anthropic.input...``), as the computer's errors do; it once named the native field
    (``action.old_str``, ``action.timeout_ms``), which the block the client sent does not have."""
    sb.files.write("/workspace/field.txt", "a\n")
    fields = [
        failed(sb, edit(OLD_EDITOR, command="str_replace", path="/workspace/field.txt", old_str="b"), "no_match"),
        failed(sb, tool_use("bash", {"command": "sleep 60", "timeout_ms": 300}), "timeout"),
        failed(sb, member("left_click", coordinate=[99_999, 1]), "out_of_bounds"),
    ]
    assert [reply["error"]["field"].split(".")[0] for reply in fields] == ["anthropic"] * 3, [
        reply["error"]["field"] for reply in fields
    ]


def test_the_envelope_keeps_working_with_a_block(sb: Sandbox) -> None:
    """``screenshot`` on a tool_use block: the image comes in the tool_result, after the text."""
    block = tool_use("bash", {"command": "echo with-a-screenshot"})
    result = run(sb, block, screenshot={"format": "jpeg", "width": 320})
    assert [part["type"] for part in result["content"]] == ["text", "image"]
    assert text_of(result) == "with-a-screenshot\n" and image_of(result).size == (320, 200)
    quiet = run(sb, tool_use("computer", {"action": "mouse_move", "coordinate": [5, 5]}), screenshot=False)
    assert quiet["content"] == []
