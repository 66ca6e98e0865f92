"""What each native action answers: one frozen pydantic model per action's ``result``.

Each action model in :mod:`corral.protocol.actions` names its result model in its ``result``
class attribute. The sandbox builds these and the reply carries :meth:`Result.wire` of them; a
client may read a native reply's ``result`` back with the same model. The wire shape is the one the
sandbox always sent: the fields in this order, ``None`` sent as ``null`` except where a field is
marked omitted (``_base64`` twins of names that are UTF-8, a symlink's target, a failure's optional
parts), and nothing but these keys (``extra="forbid"``: a model that validates a result saw all of it).

No result is open-ended JSON: ``secrets`` is a map of names to placeholders, everything else has
fixed keys.
"""

# No ``from __future__ import annotations`` here: pydantic would evaluate every field's annotation
# from its string when the class is made (a compile and an eval each), about 40 ms of the
# controller's cold start over these models; written plainly they are evaluated as the class body
# runs (docs/design/0470).
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from corral.protocol.downloads import Download

OutputEncoding = Literal["utf-8", "base64"]
Stream = Literal["stdout", "stderr"]
FileType = Literal["file", "directory", "symlink", "other"]


def _absent(value: object) -> bool:
    return value is None


def omitted(default: None = None) -> Any:
    """A field left out of the wire when it is None (not sent as ``null``)."""
    return Field(default=default, exclude_if=_absent)


class Result(BaseModel):
    """Base of every action's result model."""

    # Each built when first made or dumped (a session answers with a handful of the fifty), not at
    # import, where it costs a cold start CPU Chromium is starting on (docs/design/0470).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    def wire(self) -> dict[str, Any]:
        """The result as JSON-ready data, exactly as the reply carries it."""
        return self.model_dump(mode="json")


class _RootResult(RootModel[Any]):
    """Base of a result with more than one shape (the union is its ``root``)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    def wire(self) -> dict[str, Any]:
        dumped: dict[str, Any] = self.model_dump(mode="json")
        return dumped


# -- the screen and input -----------------------------------------------------------------------------------


class Done(Result):
    """An action that answers nothing but success (``{}``): ``key``, ``wait``, ``clipboard_set``, and
    ``screenshot``/``zoom``, whose image the reply carries beside the result."""


class Position(Result):
    """Where the pointer is after a pointer action (and for ``cursor_position``)."""

    x: int
    y: int


class ScrolledClicks(Result):
    clicks: int
    direction: Literal["up", "down", "left", "right"]


class ScrolledPixels(Result):
    dx: int
    dy: int
    via: Literal["cdp", "wheel"]  # CDP wheel events over the page, X wheel clicks elsewhere


class Scrolled(_RootResult):
    """A ``scroll``'s: by wheel clicks in a direction, or by pixels."""

    root: ScrolledClicks | ScrolledPixels


TypedVia = Literal["x", "cdp"]


class Typed(Result):
    typed: int  # characters
    via: TypedVia  # X key events, or CDP's while Chromium has the focus (text off the keymap)


class ClipboardText(Result):
    text: str


# -- the browser ----------------------------------------------------------------------------------------------


class PageShown(Result):
    """The active tab's URL and title (``page_info``, ``back``, ``forward``, ``reload``)."""

    url: str
    title: str


class Navigated(PageShown):
    status: int | None  # the main document's HTTP status; None when there was no response (same-document)
    # The URL was an attachment: the download it became (the page stays as it was); absent otherwise.
    download: Download | None = omitted()


class TabShown(Result):
    """The tab ``tab_new`` opened or ``tab_switch`` brought to the front."""

    id: str
    url: str
    title: str


class Tab(Result):
    index: int
    id: str
    active: bool
    url: str
    title: str


class TabList(Result):
    tabs: list[Tab]


class TabClosed(Result):
    closed: str  # the tab's id
    tabs: int  # how many are left


# -- files ----------------------------------------------------------------------------------------------------
# A name that is not UTF-8 comes with its exact bytes in ``<key>_base64``, ``<key>`` holding it with
# replacement characters (JSON cannot carry the bytes); a UTF-8 name comes without the twin.


class FileContent(Result):
    path: str
    path_base64: str | None = omitted()
    content: str
    encoding: OutputEncoding
    size: int
    offset: int
    length: int
    eof: bool


class FileWritten(Result):
    path: str
    path_base64: str | None = omitted()
    size: int
    sha256: str


class FileEntry(Result):
    """One entry of ``file_list``, or ``file_stat``'s answer: mode as an octal string, as ``file_write`` takes it."""

    path: str
    path_base64: str | None = omitted()
    name: str
    name_base64: str | None = omitted()
    type: FileType
    size: int
    mode: str
    mtime: float
    target: str | None = omitted()  # a symlink's
    target_base64: str | None = omitted()


class FileListing(Result):
    path: str
    path_base64: str | None = omitted()
    entries: list[FileEntry]
    truncated: bool


class FileRemoved(Result):
    path: str
    path_base64: str | None = omitted()
    type: FileType


class FileMoved(Result):
    source: str
    source_base64: str | None = omitted()
    destination: str
    destination_base64: str | None = omitted()


# -- commands and processes -----------------------------------------------------------------------------------


class ProcessStatus(Result):
    """The fields every process action's answer about one process shares."""

    pid: int
    exit_code: int | None
    signal: str | None  # the signal that ended it, by name
    oom_killed: bool | None  # None where the sandbox keeps no OOM counter
    duration_ms: float


class ExecFinished(ProcessStatus):
    """A foreground ``exec``'s: how it ended and what it printed (cut to fit one reply)."""

    stdout: str
    stdout_truncated: bool
    stderr: str
    stderr_truncated: bool
    timed_out: bool
    encoding: OutputEncoding


class ExecStarted(Result):
    """A background ``exec``'s: the process to ask about later."""

    pid: int
    background: Literal[True]


class ExecResult(_RootResult):
    root: ExecFinished | ExecStarted


class OutputEvent(Result):
    """An event frame of a streamed ``exec`` (sent before its reply, with the request's ``id``): a
    chunk one stream printed. Never ``ok``: that is a reply's first key."""

    id: str | int | None = None
    event: Literal["output"] = "output"
    stream: Stream
    data: str
    encoding: OutputEncoding


# -- code (run_code: a Jupyter kernel per context, run as the agent) ---------------------------------------

CodeMime = Literal[
    "text/plain",
    "text/html",
    "text/markdown",
    "text/latex",
    "image/png",
    "image/jpeg",
    "image/svg+xml",
    "application/json",
    "application/javascript",
]
"""The MIME types a ``run_code`` result carries (E2B's formats). Images are base64, everything else
text; ``application/json`` is the JSON's text (parse it), so no result is open-ended JSON."""


class CodeOutput(Result):
    """One display or execute result of a cell, as its MIME bundle (Jupyter's ``data``)."""

    data: dict[CodeMime, str]
    is_main_result: bool  # the cell's value (execute_result), not a display() call
    omitted: list[str] = Field(default_factory=list)  # MIME types left out: too large, or not one of CodeMime


class CodeLogs(Result):
    """What the cell printed, chunk by chunk as the kernel sent it (E2B's ``logs``)."""

    stdout: list[str]
    stderr: list[str]
    truncated: bool  # past the call's max_output_bytes: later chunks were dropped


class CodeError(Result):
    """The cell's exception (E2B's ``ExecutionError``), or why the kernel could not run it."""

    name: str  # e.g. ZeroDivisionError; KernelDied, KernelRestarted and Timeout are Corral's own
    value: str
    traceback: str  # as the kernel printed it, ANSI colours removed


class CodeExecution(Result):
    """``run_code``'s answer (E2B's ``Execution``): the cell's results, its logs, its error."""

    context: str
    language: Literal["python"]
    results: list[CodeOutput]
    logs: CodeLogs
    error: CodeError | None
    execution_count: int | None
    timed_out: bool  # interrupted at timeout_ms; the kernel and its state are kept unless state_lost
    state_lost: bool  # the context's kernel died or was restarted during this call: its variables are gone
    duration_ms: float


class CodeResultEvent(Result):
    """An event frame of a streamed ``run_code`` (before its reply, with the request's ``id``): one
    result as the kernel displayed it. Printed chunks come as :class:`OutputEvent` frames."""

    id: str | int | None = None
    event: Literal["result"] = "result"
    result: CodeOutput


class CodeContextInfo(Result):
    """One code context: a named kernel whose state lasts between calls."""

    name: str
    language: Literal["python"]
    state: Literal["idle", "busy"]
    pid: int  # the kernel's process, in the process table like an exec's
    execution_count: int
    started: float  # unix seconds


class CodeContextListing(Result):
    contexts: list[CodeContextInfo]


class CodeContextRemoved(Result):
    name: str
    removed: bool  # False: no such context was running


class ProcessInfo(Result):
    pid: int
    command: str | None
    argv: list[str]
    cwd: str
    pty: bool
    background: bool
    started: float  # unix seconds
    running: bool
    exit_code: int | None
    signal: str | None
    action_id: str


class ProcessListing(Result):
    processes: list[ProcessInfo]


class ProcessWaited(ProcessStatus):
    timed_out: bool
    running: bool


class Signalled(Result):
    pid: int
    signal: str


class StdinWritten(Result):
    pid: int
    written: int  # bytes


class ProcessOutputSlice(Result):
    pid: int
    stream: Stream
    data: str
    encoding: OutputEncoding
    offset: int
    next_offset: int
    dropped: int
    running: bool
    exit_code: int | None


class Resized(Result):
    pid: int
    rows: int
    cols: int


# -- tools ----------------------------------------------------------------------------------------------------


class ShellOutput(Result):
    output: str  # stdout and stderr interleaved (with ``split_stderr``: stdout alone)
    exit_code: int | None
    truncated: bool
    restarted: bool
    stderr: str | None = None  # with ``split_stderr``: what the command wrote to stderr

    def wire(self) -> dict[str, Any]:
        data = super().wire()
        if self.stderr is None:
            del data["stderr"]  # a reply carries it only when asked for (split_stderr)
        return data


class ToolOutput(Result):
    """The editor's and ``apply_patch``'s: what the reference tool prints, and the path it acted on."""

    output: str
    path: str


class GlobMatches(Result):
    paths: list[str]
    truncated: bool


class GrepMatch(Result):
    path: str
    line: int
    text: str


class GrepMatches(Result):
    matches: list[GrepMatch]
    truncated: bool


class SecretPlaceholders(Result):
    secrets: dict[str, str]  # name to placeholder


# -- the control lease ----------------------------------------------------------------------------------------


class HelpRequest(Result):
    reason: str
    at: float


class HandBack(Result):
    """A human's return of the lease (also the reply's ``control`` member when the agent hears of it there)."""

    by: str
    note: str | None
    at: float
    left: bool  # the holder went away rather than handing back


class LeaseView(Result):
    """The lease as it is: who holds it since when, and the agent's call for help if one is open
    (also the ``lease`` member of the live view's messages)."""

    holder: str
    since: float  # unix seconds
    help: HelpRequest | None


class LeaseAnswer(LeaseView):
    """``control``'s and ``request_control``'s: the lease as it is, and the hand-back if one waited."""

    handed_back: HandBack | None


# -- a step that failed inside a vendor call that answers each step ---------------------------------------------


class ErrorBody(Result):
    """A failure's ``error`` member (:meth:`corral.errors.CodedError.to_dict`)."""

    code: str
    message: str
    field: str | None = omitted()
    holder: str | None = omitted()  # lease_held: who holds the lease, since when
    since: float | None = omitted()


class StepFailed(Result):
    """A step of a vendor call that answers each step (a shell_call's commands) which failed."""

    error: ErrorBody


AnyResult = (
    Done
    | Position
    | Scrolled
    | Typed
    | ClipboardText
    | PageShown
    | Navigated
    | TabShown
    | TabList
    | TabClosed
    | FileContent
    | FileWritten
    | FileEntry
    | FileListing
    | FileRemoved
    | FileMoved
    | ExecResult
    | ProcessListing
    | ProcessWaited
    | Signalled
    | StdinWritten
    | ProcessOutputSlice
    | Resized
    | ShellOutput
    | ToolOutput
    | GlobMatches
    | GrepMatches
    | SecretPlaceholders
    | CodeExecution
    | CodeContextListing
    | CodeContextInfo
    | CodeContextRemoved
    | LeaseAnswer
    | StepFailed
)
"""Every result model, as :class:`corral.protocol.plan.ActionResult` holds one."""
