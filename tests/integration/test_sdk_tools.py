"""The SDK's vendor calls through a real gateway and sandbox, fed the vendors' own SDK objects: a whole
Messages reply and a whole Responses reply come back as the results to send, a failure as its vendor
form with Corral's error beside it (the pure side is tests/unit/test_sdk_tools.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from anthropic.types.beta import BetaMessage
from openai.types.responses import Response

from corral import ActionFailed, AsyncSandbox, Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway

pytestmark = pytest.mark.usefixtures("desktop_image")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-sdk-tools") as running:
        yield running


MESSAGE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "usage": {"input_tokens": 1, "output_tokens": 1},
    "stop_reason": "tool_use",
    "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "cd /workspace && echo $((6 * 7))"}},
        {"type": "tool_use", "id": "toolu_2", "name": "screenshot", "input": {}, "toolset_name": "computer"},
        {
            "type": "tool_use",
            "id": "toolu_3",
            "name": "str_replace_based_edit_tool",
            "input": {"command": "str_replace", "path": "/workspace/none.txt", "old_str": "a", "new_str": "b"},
        },
    ],
}
RESPONSE = {
    "id": "resp_01",
    "object": "response",
    "created_at": 1764770000,
    "model": "gpt-5.5",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "shell_call",
            "id": "sh_1",
            "call_id": "call_1",
            "status": "completed",
            "action": {"commands": ["pwd"]},
        },
        {
            "type": "computer_call",
            "id": "cu_1",
            "call_id": "call_2",
            "status": "completed",
            "action": {"type": "screenshot"},
            "pending_safety_checks": [{"id": "sc_1", "code": "malicious_instructions", "message": "check it"}],
        },
    ],
}


def test_whole_replies_as_the_vendors_sdk_objects_come_back_as_the_results_to_send(gw: RunningGateway) -> None:
    errors: list[ActionFailed] = []
    with Sandbox.create(url=gw.url, api_key=KEY_A, labels={"suite": "sdk-tools"}) as sb:
        bash, shot, edit = sb.tool_results(BetaMessage.model_validate(MESSAGE), on_error=errors.append)
        shell, computer = sb.tool_results(Response.model_validate(RESPONSE), acknowledge_safety_checks=True)
    assert (bash["tool_use_id"], bash["content"]) == ("toolu_1", [{"type": "text", "text": "42\n"}])
    assert shot["toolset_name"] == "computer" and shot["content"][0]["type"] == "image"
    assert edit["tool_use_id"] == "toolu_3" and edit["is_error"] is True
    assert [error.code for error in errors] == ["no_such_file"]
    assert shell["output"][0]["stdout"] == "/workspace\n" and shell["call_id"] == "call_1"
    assert computer["output"]["image_url"].startswith("data:image/")
    assert computer["acknowledged_safety_checks"] == [
        {"id": "sc_1", "code": "malicious_instructions", "message": "check it"}
    ]


async def test_the_async_twin_answers_one_block(gw: RunningGateway) -> None:
    async with await AsyncSandbox.create(url=gw.url, api_key=KEY_A) as sb:
        block = MESSAGE["content"][1]  # type: ignore[index]
        result = await sb.anthropic(block)
    assert result == {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42\n"}]}
