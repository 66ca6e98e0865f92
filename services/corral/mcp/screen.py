"""The screen, the pointer and the keyboard, and the browser's pages and tabs, as MCP tools
(:class:`ScreenTools`, a part of :class:`corral.mcp.tools.CorralTools`)."""

from __future__ import annotations

from typing import Annotated, Literal

from mcp_types import CallToolResult
from pydantic import Field

from corral.client import Request, check_reply
from corral.mcp import results
from corral.mcp.base import Button, Ctx, SessionId, TabRef, ToolBase, WithScreenshot, X, Y, looked
from corral.protocol import results as r
from corral.sdk import messages
from corral.sdk.messages import Message


class ScreenTools(ToolBase):
    """What the screen shows and what the pointer, the keyboard and the browser do."""

    # -- the screen, pointer and keyboard ---------------------------------------------------------------

    async def screenshot(self, ctx: Ctx, session_id: SessionId) -> CallToolResult:
        """A screenshot of the session's screen (PNG), once it settled. Coordinates of the other tools
        are its pixels."""
        # Settled as the actions' screenshots are: after an action sent with screenshot false, the
        # page may still be moving (a form's next page on its way), and this is the model's look.
        body: Request = {**messages.screenshot("png", {}).body, "wait_for": "stable"}
        # The image goes to the model as the reply has it (base64): not decoded on the way.
        shot = Message(body, check_reply)
        return await self._answer(ctx, session_id, shot, lambda _, reply: results.image(reply))

    async def click(
        self,
        ctx: Ctx,
        session_id: SessionId,
        x: X,
        y: Y,
        button: Annotated[Button, Field(description="The mouse button.")] = "left",
        count: Annotated[int, Field(ge=1, le=3, description="2 for a double click, 3 for a triple click.")] = 1,
        screenshot: WithScreenshot = True,
    ) -> CallToolResult:
        """Click at (x, y)."""
        body = messages.click(x, y, button, count, (), looked(screenshot)).body
        return await self._act(ctx, session_id, body, r.Position, f"clicked {button} x{count} at ({x}, {y})")

    async def type_text(
        self,
        ctx: Ctx,
        session_id: SessionId,
        text: Annotated[str, Field(min_length=1, description="The text to type, any Unicode; \\n presses Enter.")],
        screenshot: WithScreenshot = True,
    ) -> CallToolResult:
        """Type text at the keyboard focus (click a field first)."""
        body = messages.type(text, looked(screenshot)).body
        return await self._act(ctx, session_id, body, r.Typed, f"typed {len(text)} characters")

    async def press_key(
        self,
        ctx: Ctx,
        session_id: SessionId,
        key: Annotated[
            str,
            Field(
                min_length=1,
                description="The key or key combination to press, in xdotool syntax: Return, Tab, Escape, ctrl+a, "
                "alt+Left, ctrl+shift+t; several separated by spaces are pressed one after another.",
            ),
        ],
        screenshot: WithScreenshot = True,
    ) -> CallToolResult:
        """Press a key or key combination (Return submits a form, Tab moves the focus)."""
        body = messages.key(key, None, looked(screenshot)).body
        return await self._act(ctx, session_id, body, r.Done, f"pressed {key}")

    async def scroll(
        self,
        ctx: Ctx,
        session_id: SessionId,
        direction: Annotated[Literal["up", "down", "left", "right"], Field(description="Which way to scroll.")],
        clicks: Annotated[int, Field(ge=1, le=200, description="How many wheel clicks.")] = 3,
        x: Annotated[int | None, Field(ge=0, description="Where to scroll (default: where the pointer is).")] = None,
        y: Annotated[int | None, Field(ge=0, description="Where to scroll (default: where the pointer is).")] = None,
        screenshot: WithScreenshot = True,
    ) -> CallToolResult:
        """Scroll with the mouse wheel."""
        body = messages.scroll(x, y, direction, clicks, None, None, looked(screenshot)).body
        return await self._act(ctx, session_id, body, r.Scrolled, f"scrolled {direction} {clicks}")

    async def move_mouse(
        self, ctx: Ctx, session_id: SessionId, x: X, y: Y, screenshot: WithScreenshot = False
    ) -> CallToolResult:
        """Move the pointer to (x, y) without clicking (hover)."""
        body = messages.pointer("move", looked(screenshot), x=x, y=y).body
        return await self._act(ctx, session_id, body, r.Position, f"moved to ({x}, {y})")

    async def drag(
        self,
        ctx: Ctx,
        session_id: SessionId,
        from_x: X,
        from_y: Y,
        to_x: X,
        to_y: Y,
        screenshot: WithScreenshot = True,
    ) -> CallToolResult:
        """Press the left button at (from_x, from_y), move to (to_x, to_y) and release there."""
        body = messages.drag([(from_x, from_y), (to_x, to_y)], looked(screenshot)).body
        return await self._act(ctx, session_id, body, r.Position, f"dragged ({from_x}, {from_y}) to ({to_x}, {to_y})")

    async def wait(
        self,
        ctx: Ctx,
        session_id: SessionId,
        ms: Annotated[int, Field(ge=0, le=60_000, description="How long to wait, in milliseconds.")] = 1_000,
        screenshot: WithScreenshot = True,
    ) -> CallToolResult:
        """Wait (for a page to load, an animation to end), then look."""
        body = messages.wait(ms, looked(screenshot)).body
        return await self._act(ctx, session_id, body, r.Done, f"waited {ms} ms")

    async def cursor_position(self, ctx: Ctx, session_id: SessionId) -> CallToolResult:
        """Where the pointer is."""
        return await self._act(ctx, session_id, messages.cursor_position().body, r.Position, "the pointer's position")

    # -- the browser's pages and tabs -------------------------------------------------------------------

    async def navigate(
        self,
        ctx: Ctx,
        session_id: SessionId,
        url: Annotated[str, Field(min_length=1, description="The address, with its scheme: https://example.com/")],
        screenshot: WithScreenshot = True,
    ) -> CallToolResult:
        """Open an address in the current tab and wait for it to load. Only allowed hosts answer; only web
        pages open (http, https, data:, blob:, about:blank: not chrome://, file://...)."""
        body = messages.navigate(url, {}, looked(screenshot)).body
        return await self._act(ctx, session_id, body, r.Navigated, f"opened {url}")

    async def list_tabs(self, ctx: Ctx, session_id: SessionId) -> CallToolResult:
        """The browser's tabs: id, index, title, address, and which one is active."""
        return await self._act(ctx, session_id, messages.tabs().body, r.TabList, "the browser's tabs")

    async def new_tab(
        self,
        ctx: Ctx,
        session_id: SessionId,
        url: Annotated[str | None, Field(description="What to open in it (default: a blank page).")] = None,
    ) -> CallToolResult:
        """Open a new tab (it becomes the active one)."""
        return await self._act(ctx, session_id, messages.tab_new(url).body, r.TabShown, "opened a tab")

    async def switch_tab(self, ctx: Ctx, session_id: SessionId, tab: TabRef) -> CallToolResult:
        """Make a tab the active one (what the screen shows and the other tools act on)."""
        return await self._act(ctx, session_id, messages.tab_switch(tab).body, r.TabShown, f"switched to {tab}")

    async def close_tab(
        self,
        ctx: Ctx,
        session_id: SessionId,
        tab: Annotated[str | int | None, Field(description="The tab's id or index (default: the active one).")] = None,
    ) -> CallToolResult:
        """Close a tab."""
        return await self._act(ctx, session_id, messages.tab_close(tab).body, r.TabClosed, "closed the tab")
