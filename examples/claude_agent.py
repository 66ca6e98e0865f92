"""A real agent loop: Claude's computer tool driving a Corral sandbox.

Needs `pip install anthropic` and ANTHROPIC_API_KEY; without them it says so and exits. Start the
gateway first (`scripts/corral up`).

    ANTHROPIC_API_KEY=... .venv/bin/python examples/claude_agent.py "Find the weather in Paris"
"""

from __future__ import annotations

import os
import sys
from typing import Any

from corral import Sandbox

DISPLAY = (1024, 640)  # what the model is told; Corral scales to the real 1280x800 screen
MODEL = os.environ.get("CORRAL_EXAMPLE_MODEL", "claude-sonnet-4-5")


def main(task: str) -> int:
    try:
        import anthropic
    except ImportError:
        print("this example needs the anthropic package: pip install anthropic", file=sys.stderr)
        return 2
    if not os.environ.get("ANTHROPIC_API_KEY"):
        print("set ANTHROPIC_API_KEY to run this example", file=sys.stderr)
        return 2
    client = anthropic.Anthropic()
    tool = {
        "type": "computer_20250124",
        "name": "computer",
        "display_width_px": DISPLAY[0],
        "display_height_px": DISPLAY[1],
    }
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    with Sandbox.create() as sb:
        for _ in range(50):
            response = client.beta.messages.create(
                model=MODEL, max_tokens=2048, tools=[tool], messages=messages, betas=["computer-use-2025-01-24"]
            )
            messages.append({"role": "assistant", "content": response.content})
            calls = [block for block in response.content if block.type == "tool_use"]
            if not calls:
                print("".join(block.text for block in response.content if block.type == "text"))
                return 0
            results = []
            for call in calls:
                try:
                    content = sb.run_anthropic(call.input, display=DISPLAY)
                    results.append({"type": "tool_result", "tool_use_id": call.id, "content": content})
                except Exception as exc:  # a structured error goes back to the model as text
                    results.append(
                        {"type": "tool_result", "tool_use_id": call.id, "is_error": True, "content": str(exc)}
                    )
            messages.append({"role": "user", "content": results})
    return 1


if __name__ == "__main__":
    sys.exit(main(" ".join(sys.argv[1:]) or "Open example.com and tell me its heading."))
