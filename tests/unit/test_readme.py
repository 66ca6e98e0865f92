"""README's snippets ask the vendors for the tools Corral serves, as the examples do."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from openai.types.responses import FunctionShellToolParam
from pydantic import TypeAdapter

ROOT = Path(__file__).resolve().parents[2]


def _example_tools() -> list[dict[str, Any]]:
    tree = ast.parse((ROOT / "examples" / "openai_agent.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "TOOLS":
            assert node.value is not None
            tools: list[dict[str, Any]] = ast.literal_eval(node.value)
            return tools
    raise AssertionError("examples/openai_agent.py has no TOOLS")


def test_the_readmes_shell_tool_is_the_local_one_the_example_uses() -> None:
    """Without ``environment: local`` the shell runs where OpenAI hosts it, not in the sandbox."""
    readme = (ROOT / "README.md").read_text()
    literals = re.findall(r'\{"type": "shell"[^\n]*?\}\}|\{"type": "shell"\}', readme)
    shells = [ast.literal_eval(literal) for literal in literals]
    (example,) = [tool for tool in _example_tools() if tool["type"] == "shell"]
    assert shells and all(shell == example for shell in shells)
    TypeAdapter(FunctionShellToolParam).validate_python(example)
