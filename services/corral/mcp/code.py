"""The code interpreter as MCP tools (:class:`CodeTools`, a part of :class:`corral.mcp.tools.CorralTools`):
``run_code`` answers what the cell printed and its results as text, its charts as image content, and
its exception as a tool error carrying the traceback; ``restart_code_context`` starts a kernel afresh."""

from __future__ import annotations

from typing import Annotated

from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent
from pydantic import Field

from corral.gateway_client import TIMEOUT_S
from corral.mcp.base import Ctx, SessionId, ToolBase
from corral.protocol import results as r
from corral.sdk import messages
from corral.sdk.execution import FORMATS, Execution, Result
from corral.sdk.messages import Message, reading

# A cell's whole run must end under the gateway client's own timeout, or the call is cut there.
MAX_CELL_TIMEOUT_MS = (TIMEOUT_S - 10) * 1000
IMAGE_MIMES = {"png": "image/png", "jpeg": "image/jpeg"}

ContextName = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="The code context: a kernel of its own whose variables last between calls (default 'default').",
    ),
]


def _result_blocks(result: Result) -> list[ContentBlock]:
    """A result for the model: an image as image content, else its text (plain, markdown, HTML, SVG)."""
    for name, mime in IMAGE_MIMES.items():
        encoded = result.data.get(FORMATS[name])
        if encoded:
            return [ImageContent(type="image", data=encoded, mime_type=mime)]
    text = result.text or result.markdown or result.html or result.svg or result.latex
    return [TextContent(type="text", text=text)] if text else []


def _structured(run: r.CodeExecution) -> dict[str, object]:
    """The execution for programs, each image's base64 replaced by its size (the image content has it)."""
    value = run.model_dump(mode="json")
    for output in value["results"]:
        for name in IMAGE_MIMES:
            mime = FORMATS[name]
            if mime in output["data"]:
                output["data"][mime] = f"<{len(output['data'][mime]) * 3 // 4} bytes: the image content>"
    return value


def execution_answer(run: r.CodeExecution) -> CallToolResult:
    """``run_code``'s answer (pure): the printed logs, each result, and the error as a tool error."""
    execution = Execution.of(run)
    head = f"[{run.context}] execution {run.execution_count}" + (" (timed out)" if run.timed_out else "")
    if run.state_lost:
        head += "; the context's kernel was restarted: its variables are gone"
    parts = [head]
    for stream, chunks in (("stdout", execution.logs.stdout), ("stderr", execution.logs.stderr)):
        if chunks:
            parts.append(f"--- {stream} ---\n{''.join(chunks)}" + (" [truncated]" if execution.logs.truncated else ""))
    content: list[ContentBlock] = [TextContent(type="text", text="\n".join(parts))]
    for result in execution.results:
        content.extend(_result_blocks(result))
    if execution.error is not None:
        error = execution.error
        content.append(TextContent(type="text", text=error.traceback or f"{error.name}: {error.value}"))
    return CallToolResult(content=content, structured_content=_structured(run), is_error=execution.error is not None)


class CodeTools(ToolBase):
    """``run_code`` and ``restart_code_context``."""

    async def run_code(
        self,
        ctx: Ctx,
        session_id: SessionId,
        code: Annotated[str, Field(min_length=1, description="Python code; the last line's value is the result.")],
        context: ContextName = "default",
        timeout_ms: Annotated[
            int | None,
            Field(
                ge=1,
                le=MAX_CELL_TIMEOUT_MS,
                description="Interrupt the cell after this many milliseconds (the kernel and its variables are kept).",
            ),
        ] = None,
    ) -> CallToolResult:
        """Run Python in a Jupyter kernel that keeps its state (variables, imports, loaded data) between
        calls: printed output, the last expression's value, tables as text and charts (matplotlib's
        plt.show()) as images. An exception is a tool error with its traceback."""
        # The SDK's message, its reply read as the action's model (the structured content is its wire).
        body = messages.run_code(code, "python", context, timeout_ms, stream=False).body
        message = Message(body, reading(r.CodeExecution))
        return await self._answer(ctx, session_id, message, lambda run, _: execution_answer(run))

    async def restart_code_context(
        self, ctx: Ctx, session_id: SessionId, context: ContextName = "default"
    ) -> CallToolResult:
        """Start a code context's kernel afresh: its variables and imports are gone (for a stuck or
        polluted state)."""
        body = messages.restart_code_context(context).body
        return await self._act(ctx, session_id, body, r.CodeContextInfo, f"restarted context {context}")
