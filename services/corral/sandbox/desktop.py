"""Runs native actions against the sandbox: X input, the screen, Chromium and the clipboard."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, assert_never

from playwright._impl._errors import Error as PlaywrightError
from Xlib.display import Display
from Xlib.error import DisplayError as XError

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.protocol.geometry import Size
from corral.protocol.plan import ActionResult, After
from corral.sandbox.agent.launcher import LauncherClient
from corral.sandbox.agent.processes import ProcessTable, RunContext
from corral.sandbox.control import takeover
from corral.sandbox.control.lease import ControlLease
from corral.sandbox.control.turns import ActionLock
from corral.sandbox.display.screen import Screen, Settled
from corral.sandbox.display.xinput import XInput
from corral.sandbox.hands import Hands
from corral.sandbox.kernels.contexts import CodeContexts
from corral.sandbox.placeholders import Placeholders
from corral.sandbox.sessionenv import SessionEnv
from corral.sandbox.settings import ControllerSettings
from corral.sandbox.tools.files import AgentFiles
from corral.sandbox.trim import release_memory
from corral.sandbox.web.browser import Browser
from corral.sandbox.web.downloadbook import DownloadBook

if TYPE_CHECKING:
    from corral.sandbox.agent.shell import PersistentShell
    from corral.sandbox.tools.editor import Editor
    from corral.sandbox.tools.patch import Patcher
    from corral.sandbox.tools.search import Search

AgentTools = tuple["Editor", "Patcher", "Search", "PersistentShell"]

# Input that may make the page load or change: what the settle after it waits on (Browser.loading).
_MAY_LOAD = (a.Click, a.MouseDown, a.MouseUp, a.Drag, a.Scroll, a.Type, a.Key)


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
        session_env: SessionEnv | None = None,
        code: CodeContexts | None = None,
        lease: ControlLease | None = None,
        tools: Callable[[], AgentTools] | None = None,
    ) -> None:
        self._settings = settings
        self.input = input
        self.screen = screen
        self.browser = browser
        self.processes = processes
        self.files = files
        # The session's secret placeholders (PUT /v1/secrets sets them; the process table reads them too).
        self.placeholders = Placeholders() if placeholders is None else placeholders
        # The session's env (PUT /v1/env sets it; the process table reads it too).
        self.session_env = SessionEnv() if session_env is None else session_env
        # The editor, patches and search (issue 13): over the agent's files and processes.
        self.editor = editor
        self.patcher = patcher
        self.search = search
        # The session's one persistent bash (the shell action), a process of the table's.
        self.shell = shell
        # Or all four built by ``tools`` on the first tool action: their modules are no part of a
        # cold start's path to its first screenshot (docs/design/0470).
        self._tools = tools
        # run_code's kernels (corral.sandbox.kernels), processes of the table's, started on first use.
        self.code = code
        self.size = Size(self.screen.width, self.screen.height)
        # The pointer, the keyboard and the clipboard (corral.sandbox.hands).
        self.hands = Hands(settings, input, browser)
        self.lock = (
            ActionLock() if lock is None else lock
        )  # the live view waits for its release (corral.sandbox.control.turns)
        # Who may drive this desktop now (the agent, a human with a control link, an exclusive CDP client).
        self.lease = ControlLease() if lease is None else lease

    @classmethod
    def open(cls, settings: ControllerSettings) -> Desktop:
        """The desktop of ``settings.display`` once its X server answers, its Chromium, and the
        agent's processes and files (through the launcher)."""
        wait_for_display(settings.display)
        launcher = LauncherClient(settings.launcher_socket)
        placeholders = Placeholders()
        session_env = SessionEnv()
        processes = ProcessTable(launcher, settings.process_settings(), placeholders, session_env)
        screen = Screen(settings.display)
        files = AgentFiles(launcher)
        lock = ActionLock()
        lease = ControlLease()

        def idle() -> None:
            """The session went idle (the driver's stop): the screen's segment and the freed heap go back."""
            screen.release_soon()
            release_memory()

        # Never stopped under an action: a long navigation outlasts the idle time and still owns the driver.
        downloads = DownloadBook(settings.download_max_file_bytes, settings.download_max_session_bytes)
        browser = Browser(
            settings.cdp_url,
            idle_stop_s=settings.browser_idle_stop_s,
            busy=lock.locked,
            stopped=idle,
            downloads=downloads,
        )
        return cls(
            settings,
            XInput(settings.display),
            screen,
            browser,
            processes,
            files,
            placeholders,
            tools=lambda: _agent_tools(files, launcher, processes),
            lock=lock,
            session_env=session_env,
            # A person's turn is no cell's timeout: the interrupt waits for its end (corral.sandbox.kernels.cell).
            code=CodeContexts.over(processes, settings.kernel_settings(), turn_over=lease.no_human),
            lease=lease,
        )

    async def close(self) -> None:
        if self.code is not None:
            await self.code.close()
        if self.processes is not None:
            await self.processes.close()
        await self.browser.close()
        self.screen.close()
        self.input.close()

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
        return ActionResult(r.Done(), image)

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
            case (
                a.Click()
                | a.MouseDown()
                | a.MouseUp()
                | a.Move()
                | a.Drag()
                | a.Scroll()
                | a.Type()
                | a.Key()
                | a.Wait()
                | a.CursorPosition()
                | a.ClipboardGet()
                | a.ClipboardSet()
            ):
                return ActionResult(await self.hands.run(action))
            case (
                a.Navigate()
                | a.Back()
                | a.Forward()
                | a.Reload()
                | a.PageInfo()
                | a.Tabs()
                | a.TabNew()
                | a.TabSwitch()
                | a.TabClose()
            ):
                return ActionResult(await browse(self.browser, action))
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
            case a.Shell() | a.Edit() | a.ApplyPatch() | a.FileGlob() | a.FileGrep() | a.Secrets():
                return ActionResult(await self._tool(action, context))
            case a.RunCode() | a.ListCodeContexts() | a.RestartCodeContext() | a.RemoveCodeContext():
                return ActionResult(await _part(self.code, "code interpreter").run(action, context))
            case a.Control():
                return ActionResult(await takeover.control(self.lease, action.wait_ms))
            case a.RequestControl():
                return ActionResult(await takeover.request_control(self.lease, action.reason, action.wait_ms))
            case _:
                # mypy proves this unreachable: a member of AnyAction without its case above fails the type check.
                assert_never(action)

    async def _tool(self, action: a.ToolAction | a.Secrets, context: RunContext) -> ToolResult:
        if self._tools is not None:
            self.editor, self.patcher, self.search, self.shell = self._tools()
            self._tools = None
        match action:
            case a.Shell():
                return await _part(self.shell, "persistent shell").run(action, context)
            case a.Edit():
                return await _part(self.editor, "the editor").run(action)
            case a.ApplyPatch():
                return await _part(self.patcher, "patches").run(action)
            case a.FileGlob() | a.FileGrep():
                return await _part(self.search, "file search").run(action, context)
            case a.Secrets():
                return r.SecretPlaceholders(secrets=dict(self.placeholders.by_name))
            case _:
                assert_never(action)


def _agent_tools(files: AgentFiles, launcher: LauncherClient, processes: ProcessTable) -> AgentTools:
    """The editor, patches, search and the persistent shell over the agent's files and processes."""
    from corral.sandbox.agent.shell import PersistentShell
    from corral.sandbox.tools.editor import Editor
    from corral.sandbox.tools.patch import Patcher
    from corral.sandbox.tools.search import Search

    editor = Editor(files, launcher)
    return editor, Patcher(editor, launcher), Search(files, processes), PersistentShell(processes)


BrowserAction = a.Navigate | a.Back | a.Forward | a.Reload | a.PageInfo | a.Tabs | a.TabNew | a.TabSwitch | a.TabClose
BrowserResult = r.Navigated | r.PageShown | r.TabList | r.TabShown | r.TabClosed
ToolResult = r.ShellOutput | r.ToolOutput | r.GlobMatches | r.GrepMatches | r.SecretPlaceholders


async def browse(browser: Browser, action: BrowserAction) -> BrowserResult:
    """A browser action's result, read into its model from what :class:`Browser` answers."""
    match action:
        case a.Navigate():
            return r.Navigated.model_validate(await browser.navigate(action.url, action.wait_until, action.timeout_ms))
        case a.Back() | a.Forward() | a.Reload():
            return r.PageShown.model_validate(await browser.history(action.type, action.timeout_ms))
        case a.PageInfo():
            return r.PageShown.model_validate(await browser.info())
        case a.Tabs():
            return r.TabList.model_validate(await browser.tabs())
        case a.TabNew():
            return r.TabShown.model_validate(await browser.tab_new(action.url))
        case a.TabSwitch():
            return r.TabShown.model_validate(await browser.tab_switch(action.tab))
        case a.TabClose():
            return r.TabClosed.model_validate(await browser.tab_close(action.tab))
        case _:
            assert_never(action)
