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

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

OutputEncoding = Literal["utf-8", "base64"]
Stream = Literal["stdout", "stderr"]
FileType = Literal["file", "directory", "symlink", "other"]


def _absent(value: object) -> bool:
    return value is None


def _omitted(default: None = None) -> Any:
    """A field left out of the wire when it is None (not sent as ``null``)."""
    return Field(default=default, exclude_if=_absent)


class Result(BaseModel):
    """Base of every action's result model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def wire(self) -> dict[str, Any]:
        """The result as JSON-ready data, exactly as the reply carries it."""
        return self.model_dump(mode="json")


class _RootResult(RootModel[Any]):
    """Base of a result with more than one shape (the union is its ``root``)."""

    model_config = ConfigDict(frozen=True)

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


class Typed(Result):
    typed: int  # characters
    via: Literal["x", "cdp"]


class ClipboardText(Result):
    text: str


# -- the browser ----------------------------------------------------------------------------------------------


class PageShown(Result):
    """The active tab's URL and title (``page_info``, ``back``, ``forward``, ``reload``)."""

    url: str
    title: str


class Navigated(PageShown):
    status: int | None  # the main document's HTTP status; None when there was no response (same-document)


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
    path_base64: str | None = _omitted()
    content: str
    encoding: OutputEncoding
    size: int
    offset: int
    length: int
    eof: bool


class FileWritten(Result):
    path: str
    path_base64: str | None = _omitted()
    size: int
    sha256: str


class FileEntry(Result):
    """One entry of ``file_list``, or ``file_stat``'s answer: mode as an octal string, as ``file_write`` takes it."""

    path: str
    path_base64: str | None = _omitted()
    name: str
    name_base64: str | None = _omitted()
    type: FileType
    size: int
    mode: str
    mtime: float
    target: str | None = _omitted()  # a symlink's
    target_base64: str | None = _omitted()


class FileListing(Result):
    path: str
    path_base64: str | None = _omitted()
    entries: list[FileEntry]
    truncated: bool


class FileRemoved(Result):
    path: str
    path_base64: str | None = _omitted()
    type: FileType


class FileMoved(Result):
    source: str
    source_base64: str | None = _omitted()
    destination: str
    destination_base64: str | None = _omitted()


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


class Written(Result):
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
    output: str  # stdout and stderr interleaved
    exit_code: int | None
    truncated: bool
    restarted: bool


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


class LeaseAnswer(Result):
    """``control``'s and ``request_control``'s: the lease as it is, and the hand-back if one waited."""

    holder: str
    since: float
    help: HelpRequest | None
    handed_back: HandBack | None


# -- a step that failed inside a vendor call that answers each step ---------------------------------------------


class ErrorBody(Result):
    """A failure's ``error`` member (:meth:`corral.errors.CodedError.to_dict`)."""

    code: str
    message: str
    field: str | None = _omitted()
    holder: str | None = _omitted()  # lease_held: who holds the lease, since when
    since: float | None = _omitted()


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
    | Written
    | ProcessOutputSlice
    | Resized
    | ShellOutput
    | ToolOutput
    | GlobMatches
    | GrepMatches
    | SecretPlaceholders
    | LeaseAnswer
    | StepFailed
)
"""Every result model, as :class:`corral.protocol.plan.ActionResult` holds one."""
