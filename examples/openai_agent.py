"""A real agent loop: an OpenAI model with the computer, shell and apply_patch tools of the Responses
API, all served by one Corral sandbox.

Each response goes to the sandbox whole (`sb.tool_results(response)`): every `computer_call`,
`shell_call` and `apply_patch_call` in its output is run and answered with its complete output item
(`computer_call_output` with a screenshot, `shell_call_output` per command, `apply_patch_call_output`
`completed` or `failed` with the reason), ready to be the next request's input. No glue.

Needs `pip install openai` and OPENAI_API_KEY; without them it says so and exits. Start the gateway
first (`scripts/corral up`).

    OPENAI_API_KEY=... .venv/bin/python examples/openai_agent.py "Write hello.py in /workspace and run it"

`CORRAL_EXAMPLE_OPENAI_MODEL` picks the model.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from corral import ActionFailed, Sandbox

MODEL = os.environ.get("CORRAL_EXAMPLE_OPENAI_MODEL", "gpt-5.5")
TOOLS: list[dict[str, Any]] = [
    {"type": "computer"},  # the screen's own size: 1280x800
    {"type": "shell", "environment": {"type": "local"}},  # run by us, here: in the sandbox
    {"type": "apply_patch"},
]
INSTRUCTIONS = (
    "You control a Linux desktop with Chromium through the computer tool, and a shell and apply_patch in "
    "the same machine (work in /workspace). Check each step's result before the next one."
)


def main(task: str) -> int:
    try:
        import openai
    except ImportError:
        print("this example needs the openai package: pip install openai", file=sys.stderr)
        return 2
    if not os.environ.get("OPENAI_API_KEY"):
        print("set OPENAI_API_KEY to run this example", file=sys.stderr)
        return 2
    client = openai.OpenAI()
    with Sandbox.create() as sb:
        # TOOLS and the results are plain dicts; the SDK's overloads want its TypedDicts.
        response = client.responses.create(  # type: ignore[call-overload]
            model=MODEL,
            instructions=INSTRUCTIONS,
            tools=TOOLS,
            input=task,
            truncation="auto",
        )
        for _ in range(50):
            for item in response.output:
                if item.type in ("computer_call", "shell_call", "apply_patch_call"):
                    print(f"-> {item.type}", file=sys.stderr)
            # A computer_call may carry pending_safety_checks: a real agent shows them to a person first.
            results = sb.tool_results(response, acknowledge_safety_checks=True, on_error=report)
            if not results:
                print(response.output_text)
                return 0
            response = client.responses.create(  # type: ignore[call-overload]
                model=MODEL,
                instructions=INSTRUCTIONS,
                tools=TOOLS,
                previous_response_id=response.id,
                input=results,
                truncation="auto",
            )
    return 1


def report(error: ActionFailed) -> None:
    """Corral's structured error of a failed call (the model gets the vendor's form in the output item)."""
    print(f"   tool error: {error}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(" ".join(sys.argv[1:]) or "Write /workspace/hello.py printing the date, run it, show me."))
