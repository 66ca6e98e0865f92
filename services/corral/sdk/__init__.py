"""The Corral SDK: create a session through the gateway and drive it.

    from corral import Sandbox
    with Sandbox.create(allow=["example.com"]) as sb:
        sb.navigate("https://example.com")
        sb.click(100, 200)
        png = sb.screenshot()

Commands and files too (docs/protocol.md):

        result = sb.exec("pytest -q", cwd="/workspace/app").check()
        for item in sb.exec_stream(argv=["make"]):  # OutputChunk as it comes, then the ExecResult
            ...
        pid = sb.processes.start("python -m http.server")
        sb.files.write("/workspace/a.txt", "hi"); sb.files.upload("data.bin", "/workspace/data.bin")

A code interpreter, as E2B's (docs/code.md): a kernel per context whose state lasts between calls.

        sb.run_code("import pandas as pd; df = pd.DataFrame({'a': [1, 2]})")
        execution = sb.run_code("df.a.sum()")  # execution.text == "3"
        sb.run_code("df.plot()", on_result=lambda result: save(result.png))  # a chart as it comes

The vendors' tool calls go in whole and come back as the whole result to send to the model
(docs/protocol.md, "Vendor tools"): ``sb.anthropic(tool_use_block)`` gives the ``tool_result``,
``sb.openai(output_item)`` the ``*_output`` item, ``sb.tool_results(reply)`` every result of a whole
Messages or Responses reply, in order. A failed call comes back as the vendor's own error form for
the model to read (``on_error`` hears Corral's structured error); only a call that cannot be read,
or a lost session, raises.

        results = sb.tool_results(client.beta.messages.create(...))  # append as the next user message

A human with a control link may take the session over (docs/protocol.md, "The control lease"):
the agent's calls then raise :class:`ActionFailed` with code ``control_taken``, or wait for the
lease (``sb.wait_for_control_ms``, or ``wait_for_control_ms=`` where a call takes envelope options).
``sb.control(wait_ms=...)`` waits for the hand-back and returns the human's note; ``sb.handed_back``
is the note a call's reply carried; ``sb.request_control(reason)`` asks a human for help.

``AsyncSandbox`` is the same with ``async``/``await``: the same methods with the same parameters
(a unit test holds them to it). ``run_anthropic`` and ``run_openai`` (the computer tool's bare input
and action) return exactly what to send back to each model API.

What the methods answer (docs/sdk.md, "What a method answers"): each action's method answers its
result model (:mod:`corral.protocol.results`: ``click`` a ``Position``, ``navigate`` a
``Navigated``, ``files.stat`` a ``FileEntry``), or the one value it is about (``screenshot`` the
image's bytes, ``cursor_position`` an ``(x, y)``, ``exec`` an :class:`ExecResult`); a failure raises
:class:`ActionFailed`. Only ``request`` and ``act`` answer the reply itself (any message's: open-ended
JSON, the after-action ``screenshot`` in it), and the vendors' calls the vendor's own JSON.

Every method is one line in each twin: a pure function of :class:`messages` builds the
:class:`Message` to the sandbox and says how its reply is read; the twins only send it, blocking or
awaited. The gateway's HTTP API is :mod:`corral.gateway_client`.
"""

from __future__ import annotations

from corral.client import Envelope
from corral.commands import ExecResult, OutputChunk
from corral.errors import ActionFailed, CommandFailed, GatewayError
from corral.gateway_client import AsyncGateway, Gateway, api_key, gateway_url
from corral.gateway_models import SessionInfo, TrafficRecord, UploadedFile
from corral.sdk.execution import Execution, ExecutionError, Logs, OutputMessage, Result
from corral.sdk.files import AsyncFiles, Files
from corral.sdk.messages import Message, messages
from corral.sdk.processes import AsyncProcesses, Processes
from corral.sdk.sandbox import AsyncSandbox, Sandbox
from corral.sdk.streams import AsyncExecStream, ExecStream

__all__ = [
    "ActionFailed",
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncGateway",
    "AsyncProcesses",
    "AsyncSandbox",
    "CommandFailed",
    "Envelope",
    "ExecResult",
    "ExecStream",
    "Execution",
    "ExecutionError",
    "Files",
    "Gateway",
    "GatewayError",
    "Logs",
    "Message",
    "OutputChunk",
    "OutputMessage",
    "Processes",
    "Result",
    "Sandbox",
    "SessionInfo",
    "TrafficRecord",
    "UploadedFile",
    "api_key",
    "gateway_url",
    "messages",
]
