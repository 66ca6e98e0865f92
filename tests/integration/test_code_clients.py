"""The code interpreter from every client, against the real image through a real gateway: the SDK's
``run_code`` (sync and async) with state across calls, a matplotlib chart heard by ``on_result`` as it
comes, a pandas table, an exception; ``corral run-code`` (streamed output, an image saved, exit codes);
the MCP ``run_code`` tool through the ``mcp`` package's own client (a chart as image content, an
exception as a tool error); and a recorded ``run_code`` session replayed by ``corral replay``."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, ImageContent, TextContent
from PIL import Image

from corral.recording.bundle import read_bundle
from corral.sdk import AsyncSandbox, OutputMessage, Result, Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway, replay_cli, unpack_recording

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

SERVICES = str(Path(__file__).resolve().parents[2] / "services")
CHART = """
import matplotlib.pyplot as plt
print("drawing")
plt.figure(figsize=(4, 3))
plt.bar(["a", "b", "c"], [3, 1, 2])
plt.show()
print("drawn")
"""
COLD_MS = 180_000  # the first call starts the kernel and imports pandas


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-codeclient") as running:
        yield running


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as box:
        yield box


def _png(result: Result) -> Image.Image:
    assert result.png is not None
    return Image.open(io.BytesIO(base64.b64decode(result.png)))


def test_sdk_state_a_chart_heard_as_it_comes_a_table_and_an_error(sb: Sandbox) -> None:
    first = sb.run_code("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})\nx = 20", timeout_ms=COLD_MS)
    assert first.error is None and first.results == [], first
    assert sb.run_code("x + 1").text == "21"  # the variable lasted
    heard: list[tuple[str, object]] = []
    execution = sb.run_code(
        CHART,
        on_stdout=lambda message: heard.append(("stdout", message.line)),
        on_result=lambda result: heard.append(("result", result.formats())),
    )
    assert execution.error is None
    assert [kind for kind, _ in heard] == ["stdout", "result", "stdout"], heard  # in the order printed
    assert heard[0] == ("stdout", "drawing\n") and "png" in heard[1][1]  # type: ignore[operator]
    chart = next(result for result in execution.results if result.png)
    assert _png(chart).format == "PNG" and _png(chart).width > 100 and not chart.is_main_result
    assert "".join(execution.logs.stdout) == "drawing\ndrawn\n"
    table = sb.run_code("df")
    assert table.results[0].is_main_result and "<table" in (table.results[0].html or "")
    failed = sb.run_code("df['missing']")
    assert failed.error is not None and failed.error.name == "KeyError" and "missing" in failed.error.traceback
    contexts = sb.list_code_contexts()
    assert [c.name for c in contexts] == ["default"] and contexts[0].execution_count >= 5
    restarted = sb.restart_code_context()
    assert restarted.execution_count == 0
    lost = sb.run_code("x")
    assert lost.error is not None and lost.error.name == "NameError"  # a restart forgets


async def test_async_sdk_keeps_state_per_context_and_streams_to_async_callbacks(gw: RunningGateway) -> None:
    async with await AsyncSandbox.create(url=gw.url, api_key=KEY_A) as sb:
        await sb.run_code("n = 1", context="one", timeout_ms=COLD_MS)
        await sb.run_code("n = 2", context="two", timeout_ms=COLD_MS)
        heard: list[OutputMessage] = []

        async def on_stdout(message: OutputMessage) -> None:
            heard.append(message)

        one = await sb.run_code("print(n * 10)\nn", context="one", on_stdout=on_stdout)
        assert one.text == "1" and [m.line for m in heard] == ["10\n"] and not heard[0].error
        assert (await sb.run_code("n", context="two")).text == "2"
        timed = await sb.run_code("import time\ntime.sleep(30)", context="two", timeout_ms=1000)
        assert timed.timed_out and not timed.state_lost
        assert (await sb.run_code("n", context="two")).text == "2"  # the kernel survived the interrupt
        removed = await sb.remove_code_context("two")
        assert removed.removed and [c.name for c in await sb.list_code_contexts()] == ["one"]


def _corral(gw: RunningGateway, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_URL": gw.url, "CORRAL_API_KEY": KEY_A, "PYTHONPATH": SERVICES}
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", *args], env=env, input=stdin, capture_output=True, text=True, timeout=300
    )


def test_cli_run_code(gw: RunningGateway, sb: Sandbox, tmp_path: Path) -> None:
    sb.run_code("y = 6", timeout_ms=COLD_MS)
    done = _corral(gw, "run-code", sb.id, "print('seven:', y + 1)\ny * 7")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "seven: 7\n42\n"
    images = tmp_path / "images"
    chart = _corral(gw, "run-code", sb.id, "--save-images", str(images), stdin=CHART)
    assert chart.returncode == 0, chart.stderr
    assert chart.stdout.startswith("drawing\n") and "drawn\n" in chart.stdout
    assert Image.open(images / "result-1.png").format == "PNG"
    failed = _corral(gw, "run-code", sb.id, "1/0")
    assert failed.returncode == 1 and "ZeroDivisionError" in failed.stderr
    timed = _corral(gw, "run-code", sb.id, "--timeout", "1", "import time; time.sleep(30)")
    assert timed.returncode == 124, timed.stderr
    listed = _corral(gw, "code", "contexts", sb.id)
    assert listed.returncode == 0 and "default" in listed.stdout


@asynccontextmanager
async def mcp_client(gw: RunningGateway) -> AsyncIterator[Client]:
    env = {"CORRAL_URL": gw.url, "CORRAL_API_KEY": KEY_A, "PYTHONPATH": SERVICES}
    server = StdioServerParameters(command=sys.executable, args=["-m", "corral.cli", "mcp"], env=env)
    async with Client(server) as client:
        yield client


async def test_mcp_run_code_through_the_real_client(gw: RunningGateway, sb: Sandbox) -> None:
    sb.run_code("z = 5", timeout_ms=COLD_MS)
    async with mcp_client(gw) as client:
        value = await client.call_tool("run_code", {"session_id": sb.id, "code": "print('hi')\nz * 2"})
        assert isinstance(value, CallToolResult) and not value.is_error
        texts = [block.text for block in value.content if isinstance(block, TextContent)]
        assert "hi\n" in texts[0] and texts[-1] == "10"
        chart = await client.call_tool("run_code", {"session_id": sb.id, "code": CHART})
        assert isinstance(chart, CallToolResult) and not chart.is_error
        pictures = [block for block in chart.content if isinstance(block, ImageContent)]
        assert len(pictures) == 1 and pictures[0].mime_type == "image/png"
        assert Image.open(io.BytesIO(base64.b64decode(pictures[0].data))).format == "PNG"
        raised = await client.call_tool("run_code", {"session_id": sb.id, "code": "raise ValueError('nope')"})
        assert isinstance(raised, CallToolResult) and raised.is_error
        last = raised.content[-1]
        assert isinstance(last, TextContent) and "ValueError: nope" in last.text and "Traceback" in last.text
        restarted = await client.call_tool("restart_code_context", {"session_id": sb.id})
        assert isinstance(restarted, CallToolResult) and not restarted.is_error
        gone = await client.call_tool("run_code", {"session_id": sb.id, "code": "z"})
        assert isinstance(gone, CallToolResult) and gone.is_error  # NameError: a restart forgets


def test_a_recorded_run_code_session_replays(gw: RunningGateway, tmp_path: Path) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as box:
        box.run_code("import matplotlib.pyplot as plt\nvalues = [3, 1, 2]", timeout_ms=COLD_MS)
        box.run_code(CHART.replace("[3, 1, 2]", "values"))
        box.run_code("sum(values)")
        session_id = box.id
    recorded = unpack_recording(gw, session_id, tmp_path, lambda bundle: len(bundle.actions) == 3)
    steps = read_bundle(recorded).actions
    chart = steps[1]
    assert chart["request"]["action"]["code"].startswith("\nimport matplotlib")
    assert chart["reply"]["result"]["logs"]["stdout"] == ["drawing\ndrawn\n"]  # joined per stream
    png = next(key for key in chart["payloads"] if key.endswith("image/png"))
    assert chart["payloads"][png]["size"] > 1000
    code, junit, report = replay_cli(gw, recorded, tmp_path)
    assert code == 0, junit
    assert "result 1 image/png matches" in junit and "result 1 text/plain matches" in junit
    assert "result 1 image/png" in report  # the HTML report lists each check
