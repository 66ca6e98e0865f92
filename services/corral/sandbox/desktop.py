"""Runs native actions against the sandbox: X input, the screen, Chromium and the clipboard."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any, TypeVar, assert_never

from playwright._impl._errors import Error as PlaywrightError
from Xlib.display import Display
from Xlib.error import DisplayError as XError

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol.geometry import Size
from corral.protocol.keys import Key, parse_key
from corral.protocol.plan import ActionResult, After
from corral.sandbox.agent.launcher import LauncherClient
from corral.sandbox.agent.processes import ProcessTable, RunContext
from corral.sandbox.agent.shell import PersistentShell
from corral.sandbox.control import takeover
from corral.sandbox.control.lease import ControlLease
from corral.sandbox.control.turns import ActionLock
from corral.sandbox.display import clipboard
from corral.sandbox.display.screen import Screen, Settled
from corral.sandbox.display.xinput import XInput
from corral.sandbox.placeholders import Placeholders
from corral.sandbox.settings import ControllerSettings
from corral.sandbox.tools.editor import Editor
from corral.sandbox.tools.files import AgentFiles
from corral.sandbox.tools.patch import Patcher
from corral.sandbox.tools.search import Search
from corral.sandbox.trim import release_memory
from corral.sandbox.web.browser import Browser

MULTI_CLICK_GAP_S = 0.02
# Input that may make the page load or change: what the settle after it waits on (Browser.loading).
_MAY_LOAD = (a.Click, a.MouseDown, a.MouseUp, a.Drag, a.Scroll, a.Type, a.Key)

# Viewport origin of Chromium's active tab on the screen, for pixel-exact wheel events over CDP.
_VIEWPORT_JS = """() => {
  const border = Math.max(0, (window.outerWidth - window.innerWidth) / 2);
  return [window.screenX + border, window.screenY + window.outerHeight - window.innerHeight - border,
          window.innerWidth, window.innerHeight];
}"""


def wait_for_display(display: str, timeout_s: float = 30.0) -> None:
    """Block until the X server of ``display`` accepts connections (the init starts both at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            Display(display).close()
            return
        except (XError, OSError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"X display {display} did not come up within {timeout_s:.0f}s") from None
            time.sleep(0.02)


_T = TypeVar("_T")


def _part(part: _T | None, what: str) -> _T:
    """A part of the desktop, or ``unsupported`` when this controller was built without it."""
    if part is None:
        raise ActionError(ErrorCode.UNSUPPORTED, f"this controller has no {what}")
    return part


class Desktop:
    """The sandbox's desktop. Callers hold :attr:`lock` so actions never interleave, except the
    process and file actions (:data:`corral.protocol.actions.ProcessAction`, ``FileAction``) and
    ``secrets``, which never touch the screen and run beside the others (a long build or a big write must not hold up
    a screenshot)."""

    def __init__(
        self,
        settings: ControllerSettings,
        input: XInput,
        screen: Screen,
        browser: Browser,
        processes: ProcessTable | None = None,
        files: AgentFiles | None = None,
        placeholders: Placeholders | None = None,
        editor: Editor | None = None,
        patcher: Patcher | None = None,
        search: Search | None = None,
        shell: PersistentShell | None = None,
        lock: ActionLock | None = None,
    ) -> None:
        self._settings = settings
        self.input = input
        self.screen = screen
        self.browser = browser
        self.processes = processes
        self.files = files
        # The session's secret placeholders (PUT /v1/secrets sets them; the process table reads them too).
        self.placeholders = Placeholders() if placeholders is None else placeholders
        # The editor, patches and search (issue 13): over the agent's files and processes.
        self.editor = editor
        self.patcher = patcher
        self.search = search
        # The session's one persistent bash (the shell action), a process of the table's.
        self.shell = shell
        self.size = Size(self.screen.width, self.screen.height)
        self.lock = (
            ActionLock() if lock is None else lock
        )  # the live view waits for its release (corral.sandbox.control.turns)
        # Who may drive this desktop now (the agent, a human with a control link, an exclusive CDP client).
        self.lease = ControlLease()

    @classmethod
    def open(cls, settings: ControllerSettings) -> Desktop:
        """The desktop of ``settings.display`` once its X server answers, its Chromium, and the
        agent's processes and files (through the launcher)."""
        wait_for_display(settings.display)
        launcher = LauncherClient(settings.launcher_socket)
        placeholders = Placeholders()
        processes = ProcessTable(launcher, settings.process_settings(), placeholders)
        screen = Screen(settings.display)
        files = AgentFiles(launcher)
        editor = Editor(files, launcher)
        lock = ActionLock()

        def idle() -> None:
            """The session went idle (the driver's stop): the screen's segment and the freed heap go back."""
            screen.release_soon()
            release_memory()

        # Never stopped under an action: a long navigation outlasts the idle time and still owns the driver.
        browser = Browser(settings.cdp_url, idle_stop_s=settings.browser_idle_stop_s, busy=lock.locked, stopped=idle)
        return cls(
            settings,
            XInput(settings.display),
            screen,
            browser,
            processes,
            files,
            placeholders,
            editor=editor,
            patcher=Patcher(editor, launcher),
            search=Search(files, processes),
            shell=PersistentShell(processes),
            lock=lock,
        )

    async def close(self) -> None:
        if self.processes is not None:
            await self.processes.close()
        await self.browser.close()
        self.screen.close()
        self.input.close()

    # -- helpers ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _held(self, modifiers: list[str]) -> Iterator[None]:
        keys: tuple[Key, ...] = tuple(parse_key(name) for name in modifiers)
        if keys:
            self.input.key_down(keys)
        try:
            yield
        finally:
            if keys:
                self.input.key_up(keys)

    def _move_if(self, x: int | None, y: int | None) -> None:
        if x is not None and y is not None:
            self.input.move(x, y)

    def _position(self) -> dict[str, Any]:
        x, y = self.input.position()
        return {"x": x, "y": y}

    async def capture(self, options: a.ScreenshotOptions, after: After) -> ActionResult:
        settled: Settled | None = None
        if after.wait_for_stable:
            settled = await self.screen.wait_stable(
                after.settle_quiet_ms,
                after.settle_timeout_ms,
                self._settings.settle_poll_ms,
                min_ms=after.settle_min_ms,
                busy=self.browser.loading,
            )
            frame = settled.frame
        else:
            frame = await self.screen.grab()
        image = await self.screen.encode(
            frame,
            options.format,
            quality=options.quality,
            region=options.region,
            width=options.width,
            scale=options.scale,
            cursor=options.cursor,
            settled=settled,
        )
        return ActionResult({}, image)

    # -- actions ---------------------------------------------------------------------------------------

    async def run(self, action: a.NativeAction, after: After, context: RunContext | None = None) -> ActionResult:
        """Carry out one action; screen coordinates are already checked and scaled. ``context``: the
        request's action id and event channel (process actions use them)."""
        try:
            return await self._run(action, after, context or RunContext(action_id=""))
        except PlaywrightError as exc:
            # A browser call outside the mapped ones (a page mid-navigation, a tab closing).
            message = exc.message.splitlines()[0] if exc.message else "the browser refused"
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, message) from None

    async def _run(self, action: a.NativeAction, after: After, context: RunContext) -> ActionResult:
        if isinstance(action, _MAY_LOAD):
            # The driver stopped while the session was idle: start it beside this action, so the
            # settles from here on see the page's requests again.
            self.browser.wanted()
        match action:
            case a.Screenshot() | a.Zoom():
                return await self.capture(action.options(), after)
            case a.Click():
                self._move_if(action.x, action.y)
                with self._held(action.modifiers):
                    for index in range(action.count):
                        if index:
                            # X timestamps are in ms and Chromium drops a repeat click with the same stamp.
                            await asyncio.sleep(MULTI_CLICK_GAP_S)
                        self.input.click(action.button)
                return ActionResult(self._position())
            case a.MouseDown() | a.MouseUp():
                self._move_if(action.x, action.y)
                self.input.button(action.button, down=isinstance(action, a.MouseDown))
                return ActionResult(self._position())
            case a.Move():
                with self._held(action.modifiers):
                    self.input.move(action.x, action.y)
                return ActionResult(self._position())
            case a.Drag():
                await self._drag(action)
                return ActionResult(self._position())
            case a.Scroll():
                return ActionResult(await self._scroll(action))
            case a.Type():
                via = await self._type(action)
                return ActionResult({"typed": len(action.text), "via": via})
            case a.Key():
                await self._key(action)
                return ActionResult({})
            case a.Wait():
                await asyncio.sleep(action.ms / 1000)
                return ActionResult({})
            case a.CursorPosition():
                return ActionResult(self._position())
            case a.ClipboardGet():
                return ActionResult({"text": await clipboard.get_text(self._settings.display)})
            case a.ClipboardSet():
                await clipboard.set_text(self._settings.display, action.text)
                return ActionResult({})
            case a.Navigate():
                return ActionResult(await self.browser.navigate(action.url, action.wait_until, action.timeout_ms))
            case a.Back() | a.Forward() | a.Reload():
                return ActionResult(await self.browser.history(action.type, action.timeout_ms))
            case a.PageInfo():
                return ActionResult(await self.browser.info())
            case a.Tabs():
                return ActionResult(await self.browser.tabs())
            case a.TabNew():
                return ActionResult(await self.browser.tab_new(action.url))
            case a.TabSwitch():
                return ActionResult(await self.browser.tab_switch(action.tab))
            case a.TabClose():
                return ActionResult(await self.browser.tab_close(action.tab))
            case (
                a.Exec()
                | a.ProcessList()
                | a.ProcessWait()
                | a.ProcessKill()
                | a.ProcessWrite()
                | a.ProcessOutput()
                | a.ProcessResize()
            ):
                if self.processes is None:
                    raise ActionError(ErrorCode.UNSUPPORTED, "this controller runs no commands")
                return ActionResult(await self.processes.run(action, context))
            case a.FileRead() | a.FileWrite() | a.FileList() | a.FileStat() | a.FileRemove() | a.FileMove():
                if self.files is None:
                    raise ActionError(ErrorCode.UNSUPPORTED, "this controller cannot reach the agent's files")
                return ActionResult(await self.files.run(action))
            case a.Shell():
                return ActionResult(await _part(self.shell, "persistent shell").run(action, context))
            case a.Edit():
                return ActionResult(await _part(self.editor, "the editor").run(action))
            case a.ApplyPatch():
                return ActionResult(await _part(self.patcher, "patches").run(action))
            case a.FileGlob() | a.FileGrep():
                return ActionResult(await _part(self.search, "file search").run(action, context))
            case a.Secrets():
                return ActionResult({"secrets": dict(self.placeholders.by_name)})
            case a.Control():
                return ActionResult(await takeover.control(self.lease, action.wait_ms))
            case a.RequestControl():
                return ActionResult(await takeover.request_control(self.lease, action.reason, action.wait_ms))
            case _:
                # mypy proves this unreachable: a member of AnyAction without its case above fails the type check.
                assert_never(action)

    async def _drag(self, action: a.Drag) -> None:
        first = action.path[0]
        with self._held(action.modifiers):
            self.input.move(first.x, first.y)
            self.input.button(action.button, down=True)
            try:
                x, y = first.x, first.y
                for point in action.path[1:]:
                    # Intermediate motion, so pages that track pointermove see a path and not a jump.
                    steps = max(1, math.ceil(math.dist((x, y), (point.x, point.y)) / action.step_px))
                    for i in range(1, steps + 1):
                        self.input.move(round(x + (point.x - x) * i / steps), round(y + (point.y - y) * i / steps))
                        # Paced like a hand, so pages that coalesce pointer events per frame still see a path.
                        await asyncio.sleep(action.step_ms / 1000)
                    x, y = point.x, point.y
            finally:
                self.input.button(action.button, down=False)

    async def _scroll(self, action: a.Scroll) -> dict[str, Any]:
        self._move_if(action.x, action.y)
        if action.direction is not None:
            with self._held(action.modifiers):
                self.input.scroll(action.direction, action.clicks or 1)
            return {"clicks": action.clicks or 1, "direction": action.direction}
        return await self._scroll_pixels(action.dx or 0, action.dy or 0, action.modifiers)

    async def _scroll_pixels(self, dx: int, dy: int, modifiers: list[str]) -> dict[str, Any]:
        """Pixel-exact wheel events over CDP where the pointer is over the page, wheel clicks elsewhere."""
        px, py = self.input.position()
        page = await self.browser.page()
        ox, oy, vw, vh = await page.evaluate(_VIEWPORT_JS)
        vx, vy = px - ox, py - oy
        if 0 <= vx < vw and 0 <= vy < vh:
            session = await page.context.new_cdp_session(page)
            try:
                flags = {
                    "Alt_L": 1,
                    "Alt_R": 1,
                    "Control_L": 2,
                    "Control_R": 2,
                    "Meta_L": 4,
                    "Super_L": 4,
                    "Shift_L": 8,
                    "Shift_R": 8,
                }
                mask = 0
                for name in modifiers:
                    mask |= flags.get(parse_key(name).name, 0)
                await session.send(
                    "Input.dispatchMouseEvent",
                    {
                        "type": "mouseWheel",
                        "x": vx,
                        "y": vy,
                        "deltaX": dx,
                        "deltaY": dy,
                        "modifiers": mask,
                    },
                )
            finally:
                await session.detach()
            return {"dx": dx, "dy": dy, "via": "cdp"}
        # Off the page: X wheel clicks, about 53 px each in Chromium and most toolkits.
        with self._held(modifiers):
            if dy:
                self.input.scroll("down" if dy > 0 else "up", max(1, round(abs(dy) / 53)))
            if dx:
                self.input.scroll("right" if dx > 0 else "left", max(1, round(abs(dx) / 53)))
        return {"dx": dx, "dy": dy, "via": "wheel"}

    def _chunks(self, text: str) -> Iterator[str]:
        """Pieces of at most type_chunk_chars whose unmapped characters fit the spare keycodes."""
        limit = max(1, self.input.spare_keycodes())
        size = self._settings.type_chunk_chars
        chunk: list[str] = []
        distinct: set[str] = set()
        for char in text:
            if len(chunk) >= size or (char not in distinct and len(distinct) >= limit):
                yield "".join(chunk)
                chunk, distinct = [], set()
            chunk.append(char)
            if not self.input.on_keymap(char):
                distinct.add(char)
        if chunk:
            yield "".join(chunk)

    async def _type(self, action: a.Type) -> str:
        """Type through X; text off the keymap goes through CDP while Chromium has the focus.

        Chromium reloads a changed X keymap late and meanwhile misreads or drops keys, so
        rebinding spare keycodes (xdotool's way) is kept for other windows.
        """
        if not all(self.input.on_keymap(char) for char in action.text) and (
            "chromium" in self.input.focused_wm_class()
        ):
            await self.browser.type_text(action.text, action.delay_ms)
            return "cdp"
        for chunk in self._chunks(action.text):
            if self.input.bind_for(chunk):
                # Clients (Chromium) reload the keymap asynchronously after a change.
                await asyncio.sleep(self._settings.keymap_settle_ms / 1000)
            if action.delay_ms:
                for char in chunk:
                    self.input.type_text(char)
                    await asyncio.sleep(action.delay_ms / 1000)
            else:
                self.input.type_text(chunk)
                await asyncio.sleep(0)  # let a timeout or a disconnect cut in between chunks
        return "x"

    async def _key(self, action: a.Key) -> None:
        combos = action.combos()
        for _ in range(action.repeat):
            for combo in combos:
                if action.hold_ms:
                    self.input.key_down(combo.keys)
                    try:
                        await asyncio.sleep(action.hold_ms / 1000)
                    finally:
                        self.input.key_up(combo.keys)
                else:
                    self.input.press_combo(combo)
                await asyncio.sleep(0)  # a long sequence must not hold the event loop (or the timeout)
