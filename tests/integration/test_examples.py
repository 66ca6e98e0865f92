"""The examples, run as a user runs them: a subprocess against a real gateway (the ones that need a
model's API key only say so without one)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway

pytestmark = pytest.mark.usefixtures("desktop_image")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-examples") as running:
        yield running


def _run(example: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / example)], env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_scripted_agent_example_runs_every_vendor_tool_without_a_model_key(gw: RunningGateway) -> None:
    done = _run("scripted_agent.py", {**os.environ, "CORRAL_URL": gw.url, "CORRAL_API_KEY": KEY_A})
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # Claude's computer tool, one tool_use block at a time, on a page.
    assert "page says: items: 3" in out
    assert "step 8:" in out
    # Claude's bash, text editors, computer toolset and agent toolset, and an unknown tool: a whole reply.
    for name in ("bash", "str_replace_based_edit_tool", "str_replace_editor", "zoom", "write", "grep"):
        assert f"claude {name}: " in out, name
    assert "claude spreadsheet: error " in out
    assert "corral's errors: no_match, unknown_tool" in out
    # OpenAI's computer, shell, local_shell and apply_patch: a whole Responses reply.
    for kind in ("computer_call_output", "shell_call_output", "local_shell_call_output", "apply_patch_call_output"):
        assert f"openai {kind}: " in out, kind
    assert out.rstrip().endswith("every tool answered")


@pytest.mark.parametrize(
    ("example", "key"), [("claude_agent.py", "ANTHROPIC_API_KEY"), ("openai_agent.py", "OPENAI_API_KEY")]
)
def test_the_model_examples_say_what_they_need_without_a_key(example: str, key: str) -> None:
    env = {name: value for name, value in os.environ.items() if name != key}
    done = _run(example, env)
    assert done.returncode == 2
    assert key in done.stderr
