"""Agent loops against Corral with a scripted stand-in for the model: runs with no API key.

The "model" below answers the way Claude and OpenAI's models do: Messages replies holding
`tool_use` blocks (the computer tool, the computer toolset's members, bash, the text editors, the
agent toolset) and Responses replies holding output items (`computer_call`, `shell_call`,
`local_shell_call`, `apply_patch_call`). The loop hands each block or whole reply to the sandbox
verbatim and gets back exactly what goes to the model next (`tool_result` blocks, `*_output`
items), failures included, in the vendor's own error form. Start the gateway first
(`scripts/corral up`), then:

    .venv/bin/python examples/scripted_agent.py
"""

from __future__ import annotations

import base64
import itertools
import urllib.parse
from collections.abc import Generator
from typing import Any

from corral import ActionFailed, Sandbox

PAGE = "data:text/html;charset=utf-8," + urllib.parse.quote(
    "<!doctype html><title>todo</title>"
    "<input id=t placeholder='new item' style='position:absolute;left:20px;top:40px;width:600px;height:80px;"
    "font-size:24px'><ul id=l style='position:absolute;top:140px'></ul>"
    "<script>t.addEventListener('keydown', e => { if (e.key === 'Enter') {"
    " const li = document.createElement('li'); li.textContent = t.value; l.appendChild(li);"
    " document.title = 'items: ' + l.children.length; t.value = ''; } });</script>"
)
_ids = itertools.count(1)


# -- what the "model" sends, built as the vendors' APIs return it ------------------------------------------


def tool_use(name: str, tool_input: dict[str, Any], toolset_name: str | None = None) -> dict[str, Any]:
    """A Messages API ``tool_use`` content block."""
    block = {"type": "tool_use", "id": f"toolu_{next(_ids):02d}", "name": name, "input": tool_input}
    if toolset_name is not None:
        block["toolset_name"] = toolset_name
    return block


def message(*blocks: dict[str, Any]) -> dict[str, Any]:
    """A whole Messages API reply (``client.beta.messages.create(...)``, as a dict)."""
    content = [{"type": "text", "text": "Let me do that."}, *blocks]
    return {"id": "msg_01", "type": "message", "role": "assistant", "content": content, "stop_reason": "tool_use"}


def item(kind: str, **fields: Any) -> dict[str, Any]:
    """A Responses API output item."""
    n = next(_ids)
    return {"type": kind, "id": f"{kind[:2]}_{n}", "call_id": f"call_{n}", "status": "completed", **fields}


def response(*items: dict[str, Any]) -> dict[str, Any]:
    """A whole Responses API reply (``client.responses.create(...)``, as a dict)."""
    return {"id": "resp_01", "object": "response", "output": [{"type": "reasoning", "id": "rs_1"}, *items]}


def text_of(result: dict[str, Any]) -> str:
    """The text blocks of a ``tool_result``, joined."""
    return "".join(block["text"] for block in result["content"] if block["type"] == "text")


def images_of(result: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(block["source"]["data"]) for block in result["content"] if block["type"] == "image"]


# -- 1. Claude's computer tool on a page, one block at a time ---------------------------------------------


def scripted_computer() -> Generator[dict[str, Any], dict[str, Any], None]:
    """computer_20251124 calls, one at a time; the model looks at each result it gets."""
    result = yield {"action": "screenshot"}
    assert images_of(result), result
    # The input spans 40..120 px below the browser's toolbar (about 87 px at 1280x800).
    result = yield {"action": "left_click", "coordinate": [300, 170]}
    for todo in ("buy milk", "water the plants", "call 👵"):
        result = yield {"action": "type", "text": todo}
        result = yield {"action": "key", "text": "Return"}
    yield {"action": "zoom", "region": [0, 80, 640, 400]}


def computer_loop(sb: Sandbox) -> None:
    sb.navigate(PAGE)
    model = scripted_computer()
    tool_input = next(model)
    for step in itertools.count(1):
        result = sb.anthropic(tool_use("computer", tool_input))  # -> the whole tool_result block
        images = images_of(result)
        print(f"step {step}: {tool_input} -> {len(images)} image(s), {sum(map(len, images))} bytes")
        try:
            tool_input = model.send(result)
        except StopIteration:
            break
    print("page says:", sb.page_info().title)


# -- 2. Claude's bash, text editors, computer toolset and agent toolset: whole replies ----------------------

NOTES = "/workspace/demo/notes.txt"


def claude_tools(sb: Sandbox) -> None:
    errors: list[ActionFailed] = []  # Corral's structured errors, beside the is_error results the model reads
    reply = message(
        tool_use("bash", {"command": "mkdir -p /workspace/demo && cd /workspace/demo && export GREETING=hello"}),
        tool_use("bash", {"command": 'pwd && echo "$GREETING, world"'}),  # the same shell: cwd and variables kept
        tool_use("str_replace_based_edit_tool", {"command": "create", "path": NOTES, "file_text": "one\ntwo\n"}),
        tool_use(
            "str_replace_based_edit_tool", {"command": "str_replace", "path": NOTES, "old_str": "two", "new_str": "2"}
        ),
        tool_use(
            "str_replace_based_edit_tool",
            {"command": "insert", "path": NOTES, "insert_line": 2, "insert_text": "three\n"},
        ),
        tool_use("str_replace_based_edit_tool", {"command": "view", "path": NOTES}),
        tool_use("str_replace_editor", {"command": "str_replace", "path": NOTES, "old_str": "one", "new_str": "1"}),
        tool_use("str_replace_editor", {"command": "undo_edit", "path": NOTES}),
        tool_use(
            "str_replace_based_edit_tool", {"command": "str_replace", "path": NOTES, "old_str": "four", "new_str": "4"}
        ),
        tool_use("screenshot", {}, toolset_name="computer"),
        tool_use("mouse_move", {"coordinate": [400, 300]}, toolset_name="computer"),
        tool_use("zoom", {"region": [0, 0, 320, 200]}, toolset_name="computer"),
        tool_use("write", {"file_path": "demo/plan.md", "content": "# plan\n- ship it\n"}),
        tool_use("edit", {"file_path": "demo/plan.md", "old_string": "ship it", "new_string": "ship it today"}),
        tool_use("read", {"file_path": "demo/plan.md", "view_range": [2, -1]}),
        tool_use("glob", {"pattern": "demo/**/*.md"}),
        tool_use("grep", {"pattern": "today", "path": "demo"}),
        tool_use("bash", {"command": "cat /workspace/demo/notes.txt", "timeout_ms": 5000}),
        tool_use("spreadsheet", {"cell": "A1"}),  # a tool Corral does not serve: an is_error result, not a crash
    )
    results = sb.tool_results(reply, on_error=errors.append)  # the next user message's content
    blocks = [block for block in reply["content"] if block["type"] == "tool_use"]
    for block, result in zip(blocks, results, strict=True):
        assert result["tool_use_id"] == block["id"]
        images = images_of(result)
        shown = f"{len(images)} image(s)" if images else repr(text_of(result)[:70])
        print(f"claude {block['name']}: {'error ' if result.get('is_error') else ''}{shown}")
    texts = [text_of(result) for result in results]
    assert "/workspace/demo" in texts[1] and "hello, world" in texts[1], texts[1]
    assert "three" in texts[5] and "2" in texts[5], texts[5]
    assert results[8].get("is_error") and results[18].get("is_error"), "the bad calls come back as is_error results"
    assert "ship it today" in texts[14], texts[14]
    assert "1\n2\nthree" in texts[17] or "one\n2\nthree" in texts[17], texts[17]  # undo_edit put "one" back
    print("corral's errors:", ", ".join(error.code for error in errors))


# -- 3. OpenAI's computer, shell, local_shell and apply_patch: a whole Responses reply ------------------------

UPDATE = """@@
 alpha
-beta
+BETA
 gamma
"""


def openai_tools(sb: Sandbox) -> None:
    reply = response(
        item(
            "computer_call", actions=[{"type": "move", "x": 200, "y": 200}, {"type": "wait"}], pending_safety_checks=[]
        ),
        item("shell_call", action={"commands": ["cd /workspace/demo && ls", "echo $((6 * 7))"], "timeout_ms": 10000}),
        item("shell_call", action={"commands": ["sleep 5", "echo never"], "timeout_ms": 500}),
        item("local_shell_call", action={"type": "exec", "command": ["python3", "-c", "print('local')"], "env": {}}),
        item(
            "apply_patch_call",
            operation={"type": "create_file", "path": "/workspace/demo/abc.txt", "diff": "+alpha\n+beta\n+gamma\n"},
        ),
        item("apply_patch_call", operation={"type": "update_file", "path": "/workspace/demo/abc.txt", "diff": UPDATE}),
        item("apply_patch_call", operation={"type": "update_file", "path": "/workspace/demo/abc.txt", "diff": UPDATE}),
        item("apply_patch_call", operation={"type": "delete_file", "path": "/workspace/demo/abc.txt"}),
    )
    results = sb.tool_results(reply)  # the next request's input, with previous_response_id
    for result in results:
        print(f"openai {result['type']}: {str(result.get('output'))[:90]}")
    shot, listing, timed_out, local, created, updated, stale, deleted = results
    assert shot["output"]["image_url"].startswith("data:image/")
    assert [entry["outcome"] for entry in listing["output"]][1] == {"type": "exit", "exit_code": 0}
    assert "42" in listing["output"][1]["stdout"]
    assert [entry["outcome"]["type"] for entry in timed_out["output"]] == ["timeout", "timeout"]
    assert "local" in local["output"]
    assert [created["status"], updated["status"], stale["status"], deleted["status"]] == [
        "completed",
        "completed",
        "failed",  # its context (the line "beta") is gone after the first update: nothing is changed
        "completed",
    ]


def main() -> None:
    with Sandbox.create(labels={"example": "scripted"}) as sb:
        computer_loop(sb)
        claude_tools(sb)
        openai_tools(sb)
    print("every tool answered")


if __name__ == "__main__":
    main()
