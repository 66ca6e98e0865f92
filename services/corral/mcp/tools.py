"""Corral's MCP tools: sessions, the screen, the pointer and keyboard, the browser's pages and tabs,
commands, files, the egress audit and port previews, each one call of the gateway's HTTP API as the caller.

Small tools, one per thing to do, rather than one ``computer`` tool taking an ``action``: each has a
flat schema with only its own fields, required where they are (a model fills ``click(x, y)`` right
far more often than a union of twenty actions' optional fields), its own description, and
annotations that can be true of it (``screenshot`` reads, ``click`` may change or delete what the
page holds, ``wait`` changes nothing); one ``computer`` tool could only claim the worst of them.

Every tool answers a :class:`CallToolResult` (corral.mcp.results): a refusal (bad input the
sandbox rejects, a session token asking for another session, a command's timeout) is a tool error
with Corral's code and message, never a protocol error, and the session goes on.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Annotated, Literal

from mcp_types import CallToolResult, ToolAnnotations
from pydantic import Field

from corral import commands
from corral.client import Frame
from corral.errors import ErrorCode
from corral.gateway_client import AsyncGateway, session_body
from corral.mcp import results
from corral.mcp.base import MAX_CONTROL_WAIT_MS, Ctx, SessionId
from corral.mcp.code import CodeTools
from corral.mcp.downloads import DownloadTools
from corral.mcp.previews import PreviewTools
from corral.mcp.screen import ScreenTools
from corral.protocol import results as r
from corral.sdk import messages
from corral.sdk.messages import Message, reading


def _hints(read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> ToolAnnotations:
    return ToolAnnotations(
        read_only_hint=read_only, destructive_hint=destructive, idempotent_hint=idempotent, open_world_hint=open_world
    )


# read only / destructive / idempotent / open world. "Open world": the tool acts on web pages or
# commands that reach the internet (through the session's egress policy); files, the screen and the
# gateway's own records are the closed world of one sandbox. A click, typed text or a key may submit
# or delete whatever the open page holds: destructive. Reading changes nothing: not destructive.
ANNOTATIONS: dict[str, ToolAnnotations] = {
    "create_session": _hints(False, False, False, False),
    "list_sessions": _hints(True, False, True, False),
    "end_session": _hints(False, True, True, False),
    # Not idempotent: the same seconds counted from a later now is a later expiry.
    "set_session_timeout": _hints(False, False, False, False),
    # Destructive: a pause keeps files and tabs, not the running processes.
    "pause_session": _hints(False, True, True, False),
    "resume_session": _hints(False, False, True, False),
    "screenshot": _hints(True, False, True, False),
    "click": _hints(False, True, False, True),
    "type_text": _hints(False, True, False, True),
    "press_key": _hints(False, True, False, True),
    "scroll": _hints(False, False, False, True),
    "move_mouse": _hints(False, False, True, True),
    "drag": _hints(False, True, False, True),
    "wait": _hints(True, False, True, False),
    "cursor_position": _hints(True, False, True, False),
    "navigate": _hints(False, False, True, True),
    "list_tabs": _hints(True, False, True, False),
    "new_tab": _hints(False, False, False, True),
    "switch_tab": _hints(False, False, True, False),
    "close_tab": _hints(False, True, True, False),
    "exec": _hints(False, True, False, True),
    "read_file": _hints(True, False, True, False),
    "write_file": _hints(False, True, True, False),
    # Open world and destructive as exec: a cell can do anything the agent can.
    "run_code": _hints(False, True, False, True),
    "restart_code_context": _hints(False, True, True, False),
    "audit_summary": _hints(True, False, True, False),
    # Not read-only: each takes the human's hand-back note, which the sandbox gives once.
    "control": _hints(False, False, False, False),
    "request_control": _hints(False, False, False, False),
    # Each call makes another preview (another secret): not idempotent. A revoke closes open connections.
    "preview_port": _hints(False, False, False, False),
    "list_previews": _hints(True, False, True, False),
    "revoke_preview": _hints(False, True, True, False),
    "list_downloads": _hints(True, False, True, False),
    "read_download": _hints(True, False, True, False),
}


@dataclass(frozen=True, slots=True)
class FileText:
    """A file's bytes for the model: its text when they are UTF-8, else base64."""

    content: str
    encoding: Literal["utf-8", "base64"]
    size: int

    @classmethod
    def of(cls, content: bytes) -> FileText:
        try:
            return cls(content.decode(), "utf-8", len(content))
        except UnicodeDecodeError:
            return cls(base64.b64encode(content).decode(), "base64", len(content))


def _exec_answer(result: commands.ExecResult, reply: Frame) -> CallToolResult:
    """A command's end as the tool's answer: its exit code, stdout and stderr."""
    return results.data(asdict(result), _exec_summary(result))


def _exec_summary(result: commands.ExecResult) -> str:
    ended = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    parts = [ended]
    for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            parts.append(f"--- {stream} ---\n{text}")
    return "\n".join(parts)


class CorralTools(ScreenTools, CodeTools, PreviewTools, DownloadTools):
    """The tools, bound to how they reach the gateway (:mod:`corral.mcp.access`)."""

    def tools(self) -> list[Callable[..., Awaitable[CallToolResult]]]:
        """Every tool, in the order of :data:`ANNOTATIONS` (its name is the method's)."""
        return [getattr(self, name) for name in ANNOTATIONS]

    # -- sessions ---------------------------------------------------------------------------------------

    async def create_session(
        self,
        ctx: Ctx,
        allow: Annotated[
            list[str] | None,
            Field(description="Hosts the session's browser and commands may reach: example.com, *.example.com."),
        ] = None,
        viewport_width: Annotated[int | None, Field(ge=320, le=7680, description="Screen width in pixels.")] = None,
        viewport_height: Annotated[int | None, Field(ge=240, le=4320, description="Screen height in pixels.")] = None,
        timeout_s: Annotated[
            int | None, Field(ge=1, description="End the session after this many seconds (the gateway's cap applies).")
        ] = None,
        env: Annotated[
            dict[str, str] | None,
            Field(description="Environment variables for every command in the session, NAME -> value (no secrets)."),
        ] = None,
        volume: Annotated[
            str | None,
            Field(description="A workspace volume of the key's, mounted at /workspace: files kept across sessions."),
        ] = None,
        template: Annotated[
            str | None,
            Field(description="A template to start from (NAME or NAME:VERSION): the desktop plus its packages."),
        ] = None,
        profile: Annotated[
            str | None,
            Field(description="A saved browser profile (a logged-in browser: cookies, local storage) to load."),
        ] = None,
        save_profile: Annotated[
            bool, Field(description="Save the browser into that profile when the session ends (made if missing).")
        ] = False,
    ) -> CallToolResult:
        """Start a new sandbox session: a desktop with Chromium, a shell and a /workspace, reaching only
        the allowed hosts. Needs an API key. Answers the session (its id is what every other tool takes)."""
        viewport = (viewport_width, viewport_height) if viewport_width and viewport_height else None
        body = session_body(
            allow=allow,
            viewport=viewport,
            timeout_s=timeout_s,
            labels={"via": "mcp"},
            env=env,
            volume=volume,
            template=template,
            profile=profile,
            save_profile=save_profile,
        )

        async def work(gateway: AsyncGateway) -> CallToolResult:
            # Less its token: the model drives it through these tools, and a credential in its context
            # would only be one more place to leak from.
            info = (await gateway.create_session(body)).shown()
            return results.data(info, f"session {info.get('id')} is {info.get('state')}")

        return await self._call(ctx, work)

    async def list_sessions(self, ctx: Ctx) -> CallToolResult:
        """The live sessions of this API key."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            sessions = [info.shown() for info in await gateway.sessions()]
            return results.data({"sessions": sessions})

        return await self._call(ctx, work)

    async def end_session(self, ctx: Ctx, session_id: SessionId) -> CallToolResult:
        """End a session: its sandbox and everything in it are removed (its audit log and recording stay)."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            await gateway.delete_session(session_id)
            return results.data({"id": session_id, "ended": True}, f"session {session_id} ended")

        return await self._call(ctx, work)

    async def set_session_timeout(
        self,
        ctx: Ctx,
        session_id: SessionId,
        timeout_s: Annotated[int, Field(ge=1, description="The session's new remaining lifetime, from now.")],
    ) -> CallToolResult:
        """End a session this many seconds from now, longer or shorter than before (the gateway's cap
        applies). API key only: a session's own token cannot change its lifetime."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            info = (await gateway.set_timeout(session_id, timeout_s)).shown()
            return results.data(info, f"session {session_id} now expires at {info.get('expires_at')}")

        return await self._call(ctx, work)

    async def pause_session(self, ctx: Ctx, session_id: SessionId) -> CallToolResult:
        """Pause a session while waiting (for a person, for tomorrow): its files, installed tools and
        open tabs are saved and its sandbox removed, so it holds no slot; running processes end.
        Every other tool refuses it (session_paused) until resume_session."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            info = (await gateway.pause_session(session_id)).shown()
            return results.data(info, f"session {session_id} is {info.get('state')}")

        return await self._call(ctx, work)

    async def resume_session(self, ctx: Ctx, session_id: SessionId) -> CallToolResult:
        """Resume a paused session: the same id, its files, installed tools and tabs back."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            info = (await gateway.resume_session(session_id)).shown()
            return results.data(info, f"session {session_id} is {info.get('state')}")

        return await self._call(ctx, work)

    # -- commands and files -----------------------------------------------------------------------------

    async def exec(
        self,
        ctx: Ctx,
        session_id: SessionId,
        command: Annotated[str, Field(min_length=1, description="A shell command line (run by bash -lc).")],
        cwd: Annotated[str | None, Field(description="The directory to run it in (default /workspace).")] = None,
        timeout_ms: Annotated[
            int | None, Field(ge=1, le=3_600_000, description="Kill it after this many milliseconds.")
        ] = None,
    ) -> CallToolResult:
        """Run a command in the session as its agent user and answer its exit code, stdout and stderr.
        A non-zero exit code is an answer, not an error."""
        action = commands.exec_action(command, None, cwd=cwd, timeout_ms=timeout_ms)
        return await self._answer(ctx, session_id, messages.exec(action), _exec_answer)

    async def read_file(
        self,
        ctx: Ctx,
        session_id: SessionId,
        path: Annotated[str, Field(min_length=1, description="The file's path (relative: to /workspace).")],
    ) -> CallToolResult:
        """A file's content: its text when it is UTF-8, else base64."""

        def answer(read: r.FileContent, reply: Frame) -> CallToolResult:
            try:
                content = commands.decode(read.content, read.encoding)
            except (binascii.Error, ValueError) as exc:
                return results.error(ErrorCode.FILE_FAILED, f"the file's content could not be decoded: {exc}")
            text = FileText.of(content)
            return results.data({"path": path, **asdict(text)}, text.content if text.encoding == "utf-8" else None)

        message = Message(messages.file_read(path, 0, None).body, reading(r.FileContent))
        return await self._answer(ctx, session_id, message, answer)

    async def write_file(
        self,
        ctx: Ctx,
        session_id: SessionId,
        path: Annotated[str, Field(min_length=1, description="The file's path (relative: to /workspace).")],
        content: Annotated[str, Field(description="The whole new content (UTF-8 text); replaces the file's.")],
        make_dirs: Annotated[bool, Field(description="Make missing parent directories.")] = True,
    ) -> CallToolResult:
        """Write a text file (created, or replaced whole)."""
        body = messages.file_write(path, content, False, None, make_dirs).body
        return await self._act(ctx, session_id, body, r.FileWritten, f"wrote {path}")

    # -- the control lease (a human's takeover through a viewer link) ------------------------------------

    async def control(
        self,
        ctx: Ctx,
        session_id: SessionId,
        wait_ms: Annotated[
            int,
            Field(
                ge=0,
                le=MAX_CONTROL_WAIT_MS,
                description="While a human holds control, wait up to this many milliseconds for them to hand it back.",
            ),
        ] = 0,
    ) -> CallToolResult:
        """Who controls the session now: the agent, or a human who took over through a viewer link (then
        every other tool answers control_taken). Answers the human's note once they handed control back."""
        return await self._act(ctx, session_id, messages.control(wait_ms).body, r.LeaseAnswer, "control of the session")

    async def request_control(
        self,
        ctx: Ctx,
        session_id: SessionId,
        reason: Annotated[
            str,
            Field(
                min_length=1,
                max_length=500,
                description="What the human should do, shown to everyone watching: 'solve the CAPTCHA', 'log in'.",
            ),
        ],
        wait_ms: Annotated[
            int,
            Field(ge=0, le=MAX_CONTROL_WAIT_MS, description="How long to wait for a human to step in and hand back."),
        ] = MAX_CONTROL_WAIT_MS,
    ) -> CallToolResult:
        """Ask a human for help (a login, a CAPTCHA, a confirmation): the session's viewers show the
        reason; waits for one to take control and hand it back, and answers their note (handed_back is
        null when nobody came in time: ask again or go on)."""
        body = messages.request_control(reason, wait_ms).body
        return await self._act(ctx, session_id, body, r.LeaseAnswer, "asked for a human's help")

    # -- the egress audit -------------------------------------------------------------------------------

    async def audit_summary(self, ctx: Ctx, session_id: SessionId) -> CallToolResult:
        """What the session reached, per host: requests let through, blocked, reported, errors and bytes
        (from its egress audit log; for its owner's API key, live or ended, or its own token while it lives)."""
        from corral.proxy.traffic import parse_records, summarize, summarize_secrets, totals

        async def work(gateway: AsyncGateway) -> CallToolResult:
            response = await gateway.get(f"/v1/sessions/{urllib.parse.quote(session_id, safe='')}/traffic")
            try:
                records = list(parse_records(response.text.splitlines(), source=f"session {session_id}"))
            except ValueError as exc:
                return results.error(ErrorCode.AUDIT_LOG_UNREADABLE, str(exc))
            rows = summarize(records)
            secrets = summarize_secrets(records)  # only in logs of sessions that used secrets
            used = {"secrets": [asdict(row) for row in secrets]} if secrets else {}
            return results.data({"hosts": [asdict(row) for row in rows], "total": asdict(totals(rows)), **used})

        return await self._call(ctx, work)


__all__ = ["ANNOTATIONS", "CorralTools"]
