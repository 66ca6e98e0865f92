"""A real agent loop: Claude with a computer, bash and a text editor, all served by one Corral sandbox.

Each reply of the Messages API goes to the sandbox whole (`sb.tool_results(response)`): every
`tool_use` block in it is run and answered with its complete `tool_result` block, errors included
(`is_error`, for Claude to read), ready to send back as the next user message. No glue.

Needs `pip install anthropic` and ANTHROPIC_API_KEY; without them it says so and exits. Start the
gateway first (`scripts/corral up`).

    ANTHROPIC_API_KEY=... .venv/bin/python examples/claude_agent.py "Save example.com's heading to /workspace/h.txt"
    ANTHROPIC_API_KEY=... .venv/bin/python examples/claude_agent.py --toolset "..."   # computer_toolset_20260801

`CORRAL_EXAMPLE_MODEL` picks the model.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from corral import ActionFailed, Sandbox

DISPLAY = (1024, 640)  # what the computer tool declares; Corral scales to the real 1280x800 screen
MODEL = os.environ.get("CORRAL_EXAMPLE_MODEL", "claude-sonnet-4-6")
SHELL_AND_EDITOR: list[dict[str, Any]] = [
    {"type": "bash_20250124", "name": "bash"},
    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
]
# computer_20251124 (with zoom) needs its beta header; the computer toolset is GA: each of its members
# (left_click, type, screenshot, ...) comes as its own tool_use block with toolset_name "computer", at
# the screen's own size.
COMPUTER_TOOL: dict[str, Any] = {
    "type": "computer_20251124",
    "name": "computer",
    "display_width_px": DISPLAY[0],
    "display_height_px": DISPLAY[1],
    "enable_zoom": True,
}
COMPUTER_BETAS = ["computer-use-2025-11-24"]
COMPUTER_TOOLSET: dict[str, Any] = {"type": "computer_toolset_20260801"}
SYSTEM = (
    "You control a Linux desktop with Chromium through the computer tool, and a shell and a file editor "
    "in the same machine (work in /workspace). Check each step's result before the next one."
)


def main(task: str, toolset: bool) -> int:
    try:
        import anthropic
    except ImportError:
        print("this example needs the anthropic package: pip install anthropic", file=sys.stderr)
        return 2
    if not os.environ.get("ANTHROPIC_API_KEY"):
        print("set ANTHROPIC_API_KEY to run this example", file=sys.stderr)
        return 2
    client = anthropic.Anthropic()
    tools = [COMPUTER_TOOLSET if toolset else COMPUTER_TOOL, *SHELL_AND_EDITOR]
    betas = [] if toolset else COMPUTER_BETAS
    display = None if toolset else DISPLAY
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    with Sandbox.create() as sb:
        for _ in range(50):
            response = client.beta.messages.create(
                model=MODEL,
                max_tokens=4096,
                system=SYSTEM,
                # Plain dicts, as the API takes them; the SDK types them as its TypedDicts.
                tools=tools,  # type: ignore[arg-type]
                messages=messages,  # type: ignore[arg-type]
                betas=betas,
            )
            messages.append({"role": "assistant", "content": response.content})
            if response.stop_reason != "tool_use":
                print("".join(block.text for block in response.content if block.type == "text"))
                return 0
            for block in response.content:
                if block.type == "tool_use":
                    print(f"-> {block.name} {block.input}", file=sys.stderr)
            results = sb.tool_results(response, display=display, on_error=report)
            messages.append({"role": "user", "content": results})
    return 1


def report(error: ActionFailed) -> None:
    """Corral's structured error of a failed call (Claude gets the same as an is_error tool_result)."""
    print(f"   tool error: {error}", file=sys.stderr)


if __name__ == "__main__":
    args = sys.argv[1:]
    use_toolset = "--toolset" in args
    words = [arg for arg in args if arg != "--toolset"]
    sys.exit(main(" ".join(words) or "Open example.com, then save its heading to /workspace/heading.txt.", use_toolset))
