"""An agent loop against Corral with a scripted stand-in for the model: runs with no API key.

The "model" below answers like Claude's computer tool would (tool_use inputs of computer_20250124);
the loop sends each input verbatim to the sandbox and feeds the tool_result content back, exactly
as a real loop does. Start the gateway first (`scripts/corral up`), then:

    .venv/bin/python examples/scripted_agent.py
"""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Iterator
from typing import Any

from corral import Sandbox

PAGE = "data:text/html;charset=utf-8," + urllib.parse.quote(
    "<!doctype html><title>todo</title>"
    "<input id=t placeholder='new item' style='position:absolute;left:20px;top:40px;width:600px;height:80px;"
    "font-size:24px'><ul id=l style='position:absolute;top:140px'></ul>"
    "<script>t.addEventListener('keydown', e => { if (e.key === 'Enter') {"
    " const li = document.createElement('li'); li.textContent = t.value; l.appendChild(li);"
    " document.title = 'items: ' + l.children.length; t.value = ''; } });</script>"
)


def scripted_model() -> Iterator[dict[str, Any]]:
    """What a model would ask for, one tool call at a time; it looks at each result it gets."""
    result = yield {"action": "screenshot"}
    assert result[0]["type"] == "image"
    # The input spans 40..120 px below the browser's toolbar (about 87 px at 1280x800).
    result = yield {"action": "left_click", "coordinate": [300, 170]}
    for item in ("buy milk", "water the plants", "call 👵"):
        result = yield {"action": "type", "text": item}
        result = yield {"action": "key", "text": "Return"}
    yield {"action": "zoom", "region": [0, 80, 640, 400]}


def main() -> None:
    with Sandbox.create(labels={"example": "scripted"}) as sb:
        sb.navigate(PAGE)
        model = scripted_model()
        call = next(model)
        steps = 0
        try:
            while True:
                content = sb.run_anthropic(call)  # -> the tool_result's content blocks
                steps += 1
                images = [b for b in content if b["type"] == "image"]
                print(
                    f"step {steps}: {call} -> {len(images)} image(s), "
                    f"{sum(len(base64.b64decode(b['source']['data'])) for b in images)} bytes"
                )
                call = model.send(content)
        except StopIteration:
            pass
        print("page says:", sb.page_info()["title"])


if __name__ == "__main__":
    main()
