"""Corral's native action vocabulary: one pydantic model per action type.

Models validate shape only (types, ranges, key names). Whether a point is on
the screen depends on the screen, so :mod:`corral.protocol.geometry` checks
that once the size is known.
"""

# No ``from __future__ import annotations`` here: pydantic would evaluate every field's annotation
# from its string when the class is made (a compile and an eval each), about 40 ms of the
# controller's cold start over these models; written plainly they are evaluated as the class body
# runs (docs/design/0470).
import base64
import binascii
import functools
import os
import threading
from collections.abc import Iterator
from typing import Annotated, ClassVar, Literal, Protocol, Self, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator
from pydantic_core import PydanticCustomError

from corral.contracts.urls import REFUSED_WHY, cleaned, web_url
from corral.errors import UnknownKeyError
from corral.protocol import keys as keyparse
from corral.protocol import results as r

MAX_TYPE_CHARS = 20_000
MAX_CLIPBOARD_CHARS = 1_000_000
MAX_WAIT_MS = 60_000
MAX_HOLD_MS = 10_000
MAX_PATH_POINTS = 1_000
MAX_PATH_CHARS = 4_096
MAX_FILE_READ_BYTES = 8 << 20  # base64 of it (11 MiB) fits a 16 MiB frame with room for the rest
MAX_LIST_ENTRIES = 10_000

Button = Literal["left", "right", "middle", "back", "forward"]
ImageFormat = Literal["png", "jpeg", "webp"]
Coordinate = Annotated[int, Field(ge=-100_000, le=100_000)]


class PointMapper(Protocol):
    """Maps caller coordinates to screen coordinates (see :class:`corral.protocol.geometry.Scale`)."""

    def point(self, x: int, y: int) -> tuple[int, int]: ...

    def vector(self, dx: int, dy: int) -> tuple[int, int]: ...


def _check_modifiers(value: list[str]) -> list[str]:
    for index, name in enumerate(value):
        try:
            key = keyparse.parse_key(name)
        except UnknownKeyError as exc:
            raise PydanticCustomError("unknown_key", "{message}", {"message": str(exc), "index": index}) from None
        if not key.is_modifier:
            raise PydanticCustomError(
                "unknown_key", "{name} is not a modifier key (ctrl, shift, alt, super, meta)", {"name": repr(name)}
            )
    return value


class _Model(BaseModel):
    # Built on first use, not at import: the sixty models' validators cost the controller's cold
    # start about 30 ms of CPU it spends beside Chromium's, and a session uses a few of them; the one
    # union every request is validated against is built once (native_action) (docs/design/0470).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, defer_build=True)


class Point(_Model):
    x: Coordinate
    y: Coordinate


class Region(_Model):
    """A rectangle on the screen: top-left corner, width and height in pixels."""

    x: Coordinate
    y: Coordinate
    width: Annotated[int, Field(ge=1, le=100_000)]
    height: Annotated[int, Field(ge=1, le=100_000)]

    def mapped(self, fn: PointMapper) -> "Region":
        x, y = fn.point(self.x, self.y)
        width, height = fn.vector(self.width, self.height)
        return Region(x=x, y=y, width=max(1, width), height=max(1, height))


class ScreenshotOptions(_Model):
    """How a screenshot is taken and encoded; used by ``screenshot``, ``zoom`` and after-action shots."""

    format: ImageFormat = "png"
    quality: Annotated[int, Field(ge=1, le=100)] | None = None
    scale: Annotated[float, Field(gt=0, le=4)] | None = None
    width: Annotated[int, Field(ge=8, le=16_384)] | None = None
    region: Region | None = None
    cursor: bool = False

    @model_validator(mode="after")
    def _one_size(self) -> Self:
        if self.scale is not None and self.width is not None:
            raise PydanticCustomError("invalid_field", "give either scale or width, not both")
        return self


class _Action(_Model):
    """Base of every native action. Its flags say how it runs; the tuples below are derived from them."""

    runs_apart: ClassVar[bool] = False
    """Runs beside other requests, outside the desktop's lock: it never touches the screen (commands,
    files, the tools over them, the session's placeholders) or it waits for people (the lease's)."""
    lease: ClassVar[bool] = False
    """The control lease's: never refused by the lease, and it answers a hand-back in its result."""
    human_input: ClassVar[bool] = False
    """A viewer holding the lease may send it (a paste is a ``type``), run through the same XTest path."""
    result: ClassVar[type[BaseModel]]
    """The model of what it answers (:mod:`corral.protocol.results`): a native reply's ``result``."""

    def points(self) -> Iterator[tuple[str, int, int]]:
        """(field, x, y) of every screen point the action names, for bounds checks."""
        return iter(())

    def regions(self) -> Iterator[tuple[str, Region]]:
        return iter(())

    def map_points(self, fn: PointMapper) -> Self:
        """The same action with every screen coordinate passed through ``fn``."""
        return self


class _OptionalPointAction(_Action):
    x: Coordinate | None = None
    y: Coordinate | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> Self:
        if (self.x is None) != (self.y is None):
            missing = "y" if self.y is None else "x"
            raise PydanticCustomError(
                "missing_field", "give both x and y, or neither ({missing} is missing)", {"missing": missing}
            )
        return self

    def points(self) -> Iterator[tuple[str, int, int]]:
        if self.x is not None and self.y is not None:
            yield "x", self.x, self.y

    def map_points(self, fn: PointMapper) -> Self:
        if self.x is None or self.y is None:
            return self
        x, y = fn.point(self.x, self.y)
        return self.model_copy(update={"x": x, "y": y})


class Screenshot(ScreenshotOptions, _Action):
    result: ClassVar[type[BaseModel]] = r.Done
    type: Literal["screenshot"]

    def points(self) -> Iterator[tuple[str, int, int]]:
        return iter(())

    def regions(self) -> Iterator[tuple[str, Region]]:
        if self.region is not None:
            yield "region", self.region

    def map_points(self, fn: PointMapper) -> Self:
        if self.region is None:
            return self
        return self.model_copy(update={"region": self.region.mapped(fn)})

    def options(self) -> ScreenshotOptions:
        return ScreenshotOptions.model_validate(self.model_dump(exclude={"type"}))


class Zoom(_Action):
    """A region of the screen at full resolution (or resized to ``width``)."""

    result: ClassVar[type[BaseModel]] = r.Done

    type: Literal["zoom"]
    region: Region
    format: ImageFormat = "png"
    quality: Annotated[int, Field(ge=1, le=100)] | None = None
    width: Annotated[int, Field(ge=8, le=16_384)] | None = None
    cursor: bool = False

    def regions(self) -> Iterator[tuple[str, Region]]:
        yield "region", self.region

    def map_points(self, fn: PointMapper) -> Self:
        return self.model_copy(update={"region": self.region.mapped(fn)})

    def options(self) -> ScreenshotOptions:
        return ScreenshotOptions(
            format=self.format, quality=self.quality, region=self.region, width=self.width, cursor=self.cursor
        )


class Click(_OptionalPointAction):
    result: ClassVar[type[BaseModel]] = r.Position
    human_input: ClassVar[bool] = True

    type: Literal["click"]
    button: Button = "left"
    count: Annotated[int, Field(ge=1, le=3)] = 1
    modifiers: list[str] = Field(default_factory=list, max_length=8)

    _modifiers = field_validator("modifiers")(_check_modifiers)


class MouseDown(_OptionalPointAction):
    result: ClassVar[type[BaseModel]] = r.Position
    human_input: ClassVar[bool] = True

    type: Literal["mouse_down"]
    button: Button = "left"


class MouseUp(_OptionalPointAction):
    result: ClassVar[type[BaseModel]] = r.Position
    human_input: ClassVar[bool] = True

    type: Literal["mouse_up"]
    button: Button = "left"


class Move(_Action):
    result: ClassVar[type[BaseModel]] = r.Position
    human_input: ClassVar[bool] = True

    type: Literal["move"]
    x: Coordinate
    y: Coordinate
    modifiers: list[str] = Field(default_factory=list, max_length=8)

    _modifiers = field_validator("modifiers")(_check_modifiers)

    def points(self) -> Iterator[tuple[str, int, int]]:
        yield "x", self.x, self.y

    def map_points(self, fn: PointMapper) -> Self:
        x, y = fn.point(self.x, self.y)
        return self.model_copy(update={"x": x, "y": y})


class Drag(_Action):
    """Press at ``path[0]``, move through every point, release at the last one."""

    result: ClassVar[type[BaseModel]] = r.Position

    type: Literal["drag"]
    path: Annotated[list[Point], Field(min_length=2, max_length=MAX_PATH_POINTS)]
    button: Button = "left"
    modifiers: list[str] = Field(default_factory=list, max_length=8)
    step_px: Annotated[int, Field(ge=1, le=10_000)] = 24
    step_ms: Annotated[int, Field(ge=0, le=1_000)] = 8

    _modifiers = field_validator("modifiers")(_check_modifiers)

    def points(self) -> Iterator[tuple[str, int, int]]:
        for index, point in enumerate(self.path):
            yield f"path[{index}]", point.x, point.y

    def map_points(self, fn: PointMapper) -> Self:
        path = [Point(x=x, y=y) for x, y in (fn.point(p.x, p.y) for p in self.path)]
        return self.model_copy(update={"path": path})


class Scroll(_OptionalPointAction):
    """Scroll by wheel ``clicks`` in a ``direction``, or by ``dx``/``dy`` pixels (positive: right/down)."""

    result: ClassVar[type[BaseModel]] = r.Scrolled

    human_input: ClassVar[bool] = True
    type: Literal["scroll"]
    direction: Literal["up", "down", "left", "right"] | None = None
    clicks: Annotated[int, Field(ge=1, le=200)] | None = None
    dx: Annotated[int, Field(ge=-100_000, le=100_000)] | None = None
    dy: Annotated[int, Field(ge=-100_000, le=100_000)] | None = None
    modifiers: list[str] = Field(default_factory=list, max_length=8)

    _modifiers = field_validator("modifiers")(_check_modifiers)

    @model_validator(mode="after")
    def _one_unit(self) -> Self:
        by_clicks = self.direction is not None or self.clicks is not None
        by_pixels = self.dx is not None or self.dy is not None
        if by_clicks and by_pixels:
            raise PydanticCustomError("invalid_field", "scroll by direction/clicks or by dx/dy pixels, not both")
        if not by_clicks and not by_pixels:
            raise PydanticCustomError("missing_field", "scroll needs direction (and clicks) or dx/dy pixels")
        if self.clicks is not None and self.direction is None:
            raise PydanticCustomError("missing_field", "clicks needs a direction")
        return self

    def map_points(self, fn: PointMapper) -> Self:
        moved = super().map_points(fn)
        if self.dx is None and self.dy is None:
            return moved
        dx, dy = fn.vector(self.dx or 0, self.dy or 0)
        update = {"dx": None if self.dx is None else dx, "dy": None if self.dy is None else dy}
        return moved.model_copy(update=update)


class Type(_Action):
    """Type any Unicode text as key events; long text goes in chunks."""

    result: ClassVar[type[BaseModel]] = r.Typed

    human_input: ClassVar[bool] = True
    type: Literal["type"]
    text: str
    delay_ms: Annotated[int, Field(ge=0, le=1_000)] = 0

    @field_validator("text")
    @classmethod
    def _typeable(cls, value: str) -> str:
        if len(value) > MAX_TYPE_CHARS:
            raise PydanticCustomError(
                "text_too_long",
                "text has {length} characters; at most {limit} per action",
                {"length": len(value), "limit": MAX_TYPE_CHARS},
            )
        for index, char in enumerate(value):
            try:
                keyparse.keysym_for_char(char)
            except ValueError as exc:
                raise PydanticCustomError(
                    "invalid_field", "character {index}: {message}", {"index": index, "message": str(exc)}
                ) from None
        return value


class Key(_Action):
    """Press a key combo (xdotool syntax, space-separated for a sequence), optionally held."""

    result: ClassVar[type[BaseModel]] = r.Done

    human_input: ClassVar[bool] = True
    type: Literal["key"]
    keys: Annotated[str, Field(min_length=1, max_length=1_000)]
    hold_ms: Annotated[int, Field(ge=0, le=MAX_HOLD_MS)] | None = None
    repeat: Annotated[int, Field(ge=1, le=100)] = 1

    @field_validator("keys")
    @classmethod
    def _known_keys(cls, value: str) -> str:
        try:
            keyparse.parse_sequence(value)
        except UnknownKeyError as exc:
            raise PydanticCustomError("unknown_key", "{message}", {"message": str(exc)}) from None
        return value

    def combos(self) -> tuple[keyparse.KeyCombo, ...]:
        return keyparse.parse_sequence(self.keys)


class Wait(_Action):
    result: ClassVar[type[BaseModel]] = r.Done
    type: Literal["wait"]
    ms: Annotated[int, Field(ge=0, le=MAX_WAIT_MS)] = 1_000


class CursorPosition(_Action):
    result: ClassVar[type[BaseModel]] = r.Position
    type: Literal["cursor_position"]


class ClipboardGet(_Action):
    result: ClassVar[type[BaseModel]] = r.ClipboardText
    type: Literal["clipboard_get"]


class ClipboardSet(_Action):
    result: ClassVar[type[BaseModel]] = r.Done
    type: Literal["clipboard_set"]
    text: Annotated[str, Field(max_length=MAX_CLIPBOARD_CHARS)]


WaitUntil = Literal["load", "domcontentloaded", "networkidle", "commit"]


def _has_a_scheme(url: str) -> bool:
    scheme, sep, _ = url.partition(":")
    return bool(sep) and scheme.isascii() and scheme.replace("+", "").replace("-", "").isalnum()


def _web_page(url: str) -> str:
    """``url`` if the browser may open it (corral.contracts.urls), else ``url_refused``."""
    if not web_url(url):
        raise PydanticCustomError("url_refused", REFUSED_WHY)
    return url


class Navigate(_Action):
    result: ClassVar[type[BaseModel]] = r.Navigated
    type: Literal["navigate"]
    url: Annotated[str, Field(min_length=1, max_length=65_536)]
    wait_until: WaitUntil = "load"
    timeout_ms: Annotated[int, Field(ge=1, le=300_000)] = 30_000

    @field_validator("url")
    @classmethod
    def _has_scheme(cls, value: str) -> str:
        if _has_a_scheme(cleaned(value)):  # as Chromium reads it: " chrome://quit" is chrome://quit
            _web_page(value)
        if not _has_a_scheme(value):
            raise PydanticCustomError("invalid_field", "url needs a scheme, e.g. https://example.com/")
        return _web_page(value)


class Back(_Action):
    result: ClassVar[type[BaseModel]] = r.PageShown
    type: Literal["back"]
    timeout_ms: Annotated[int, Field(ge=1, le=300_000)] = 30_000


class Forward(_Action):
    result: ClassVar[type[BaseModel]] = r.PageShown
    type: Literal["forward"]
    timeout_ms: Annotated[int, Field(ge=1, le=300_000)] = 30_000


class Reload(_Action):
    result: ClassVar[type[BaseModel]] = r.PageShown
    type: Literal["reload"]
    timeout_ms: Annotated[int, Field(ge=1, le=300_000)] = 30_000


class PageInfo(_Action):
    """The active tab's URL and title."""

    result: ClassVar[type[BaseModel]] = r.PageShown

    type: Literal["page_info"]


class Tabs(_Action):
    result: ClassVar[type[BaseModel]] = r.TabList
    type: Literal["tabs"]


TabRef = Annotated[str, Field(min_length=1, max_length=64)] | Annotated[int, Field(ge=0, le=10_000)]


class TabNew(_Action):
    result: ClassVar[type[BaseModel]] = r.TabShown
    type: Literal["tab_new"]
    url: Annotated[str, Field(max_length=65_536)] | None = None

    @field_validator("url")
    @classmethod
    def _is_a_web_page(cls, value: str | None) -> str | None:
        return None if value is None else _web_page(value)


class TabSwitch(_Action):
    result: ClassVar[type[BaseModel]] = r.TabShown
    type: Literal["tab_switch"]
    tab: TabRef


class TabClose(_Action):
    result: ClassVar[type[BaseModel]] = r.TabClosed
    type: Literal["tab_close"]
    tab: TabRef | None = None


# -- files inside the sandbox, done as the agent's uid (corral.sandbox.tools.files) -------------------------------


def _agent_path(value: str) -> str:
    """A path the agent's files can have: no NUL byte (no syscall takes one) and valid Unicode."""
    if "\x00" in value:
        raise PydanticCustomError("invalid_field", "a path cannot hold a NUL byte")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise PydanticCustomError(
            "invalid_field", "the path holds a lone surrogate; give a name that is not UTF-8 as *_base64"
        ) from None
    return value


def _agent_path_base64(value: str) -> str:
    """Base64 of a path's bytes (a name that is not UTF-8, as ``file_list`` gives it); no NUL byte in them."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise PydanticCustomError("invalid_field", "not valid base64") from None
    if not raw:
        raise PydanticCustomError("invalid_field", "an empty path")
    if b"\x00" in raw:
        raise PydanticCustomError("invalid_field", "a path cannot hold a NUL byte")
    return value


def parse_file_mode(value: int | str) -> int:
    """A permission mode: an int (``420``) or an octal string (``"0644"``, ``"644"``, ``"0o644"``)."""
    if isinstance(value, str):
        digits = value.removeprefix("0o")
        if not digits or len(digits) > 5 or any(c not in "01234567" for c in digits):
            raise PydanticCustomError("invalid_field", "mode is an octal string such as '0644', or an int")
        value = int(digits, 8)
    if not 0 <= value <= 0o7777:
        raise PydanticCustomError("invalid_field", "mode is at most 0o7777")
    return value


AgentPath = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS), AfterValidator(_agent_path)]
AgentPathBase64 = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS * 2), AfterValidator(_agent_path_base64)]
FileMode = Annotated[int | str, AfterValidator(parse_file_mode)]
FileEncoding = Literal["utf-8", "base64"]


def one_path(text: str | None, encoded: str | None, name: str) -> str:
    """The path given as ``name`` or ``name_base64`` (exactly one), as a str: bytes that are not UTF-8
    ride as surrogate escapes, the way ``os.fsdecode`` gives them."""
    if (text is None) == (encoded is None):
        kind = "missing_field" if text is None else "invalid_field"
        # ``missing``: the field the error names (corral.protocol.validation appends it to the path).
        raise PydanticCustomError(kind, "give {missing} or {missing}_base64 (exactly one)", {"missing": name})
    if text is not None:
        return text
    assert encoded is not None
    return os.fsdecode(base64.b64decode(encoded))


class OnePath(_Model):
    """One path in the sandbox: ``path`` (absolute, or relative to /workspace) or ``path_base64``;
    the file actions' and the controller's ``/v1/files`` query's."""

    path: AgentPath | None = None
    path_base64: AgentPathBase64 | None = None

    @model_validator(mode="after")
    def _one_path(self) -> Self:
        one_path(self.path, self.path_base64, "path")
        return self

    def target(self) -> str:
        return one_path(self.path, self.path_base64, "path")


class _PathAction(_Action, OnePath):
    """An action on one path."""


class FileRead(_PathAction):
    result: ClassVar[type[BaseModel]] = r.FileContent
    runs_apart: ClassVar[bool] = True

    type: Literal["file_read"]
    offset: Annotated[int, Field(ge=0)] = 0
    length: Annotated[int, Field(ge=0, le=MAX_FILE_READ_BYTES)] = MAX_FILE_READ_BYTES
    encoding: FileEncoding = "utf-8"


class FileWrite(_PathAction):
    result: ClassVar[type[BaseModel]] = r.FileWritten
    runs_apart: ClassVar[bool] = True

    type: Literal["file_write"]
    content: str | None = None
    content_base64: str | None = None
    append: bool = False
    mode: FileMode | None = None  # default: an existing file's, else 0644
    make_dirs: bool = False

    @field_validator("content")
    @classmethod
    def _encodable(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                value.encode()
            except UnicodeEncodeError:
                raise PydanticCustomError(
                    "invalid_field", "content holds a lone surrogate; send bytes as content_base64"
                ) from None
        return value

    @field_validator("content_base64")
    @classmethod
    def _base64(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise PydanticCustomError("invalid_field", "not valid base64") from None
        return value

    @model_validator(mode="after")
    def _one_content(self) -> Self:
        if (self.content is None) == (self.content_base64 is None):
            kind = "missing_field" if self.content is None else "invalid_field"
            raise PydanticCustomError(kind, "give {missing} or {missing}_base64 (exactly one)", {"missing": "content"})
        return self

    def data(self) -> bytes:
        if self.content_base64 is not None:
            return base64.b64decode(self.content_base64)
        return (self.content or "").encode()

    def file_mode(self) -> int | None:
        return None if self.mode is None else parse_file_mode(self.mode)


class FileList(_PathAction):
    result: ClassVar[type[BaseModel]] = r.FileListing
    runs_apart: ClassVar[bool] = True

    type: Literal["file_list"]
    recursive: bool = False
    pattern: Annotated[str, Field(min_length=1, max_length=1_000)] | None = None  # fnmatch on the name
    limit: Annotated[int, Field(ge=1, le=MAX_LIST_ENTRIES)] = 1_000


class FileStat(_PathAction):
    result: ClassVar[type[BaseModel]] = r.FileEntry
    runs_apart: ClassVar[bool] = True

    type: Literal["file_stat"]


class FileRemove(_PathAction):
    result: ClassVar[type[BaseModel]] = r.FileRemoved
    runs_apart: ClassVar[bool] = True

    type: Literal["file_remove"]
    recursive: bool = False


class FileMove(_Action):
    result: ClassVar[type[BaseModel]] = r.FileMoved
    runs_apart: ClassVar[bool] = True

    type: Literal["file_move"]
    source: AgentPath | None = None
    source_base64: AgentPathBase64 | None = None
    destination: AgentPath | None = None
    destination_base64: AgentPathBase64 | None = None
    overwrite: bool = False

    @model_validator(mode="after")
    def _one_each(self) -> Self:
        one_path(self.source, self.source_base64, "source")
        one_path(self.destination, self.destination_base64, "destination")
        return self

    def paths(self) -> tuple[str, str]:
        return (
            one_path(self.source, self.source_base64, "source"),
            one_path(self.destination, self.destination_base64, "destination"),
        )


FileAction = FileRead | FileWrite | FileList | FileStat | FileRemove | FileMove
"""The file actions: carried out as the agent (corral.sandbox.tools.files), never under the desktop's lock."""
FILE_ACTIONS: tuple[type[_Action], ...] = get_args(FileAction)


# -- commands and processes (run as the agent's uid; corral.sandbox.agent.processes) -------------------------------

MAX_COMMAND_BYTES = 96 * 1024  # argv (or command), env and cwd together, as UTF-8: what one launcher message holds
MAX_STDIN_BYTES = 8 << 20
MAX_PROCESS_TIMEOUT_MS = 24 * 3_600_000
DEFAULT_WORKDIR = "/workspace"
OutputEncoding = r.OutputEncoding
Stream = r.Stream


def _clean_text(value: str) -> str:
    """Text that can become a C string: no NUL byte, nothing that is not UTF-8 (a lone surrogate)."""
    if "\0" in value:
        raise PydanticCustomError("invalid_field", "a NUL byte cannot be passed to a program")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise PydanticCustomError("invalid_field", "not valid UTF-8 (a lone surrogate)") from None
    return value


def _utf8(value: str) -> str:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise PydanticCustomError("invalid_field", "not valid UTF-8 (a lone surrogate); use the _base64 form") from None
    return value


def _base64(value: str) -> str:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise PydanticCustomError("invalid_field", "not valid base64") from None
    return value


CleanText = Annotated[str, AfterValidator(_clean_text)]
Utf8Text = Annotated[str, AfterValidator(_utf8)]
Base64Text = Annotated[str, AfterValidator(_base64)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)]
Pid = Annotated[int, Field(ge=1, le=1 << 22)]


class PtySize(_Model):
    rows: Annotated[int, Field(ge=1, le=1_000)] = 24
    cols: Annotated[int, Field(ge=1, le=1_000)] = 80


class Exec(_Action):
    """Run ``command`` (through ``bash -lc``) or ``argv`` as the agent; see docs/protocol.md, "Commands"."""

    result: ClassVar[type[BaseModel]] = r.ExecResult

    runs_apart: ClassVar[bool] = True
    type: Literal["exec"]
    command: Annotated[CleanText, Field(min_length=1)] | None = None
    argv: Annotated[list[CleanText], Field(min_length=1, max_length=10_000)] | None = None
    cwd: Annotated[CleanText, Field(min_length=1, max_length=4_096)] = DEFAULT_WORKDIR
    env: dict[EnvName, CleanText] = Field(default_factory=dict, max_length=1_000)
    stdin: Utf8Text | None = None
    stdin_base64: Base64Text | None = None
    timeout_ms: Annotated[int, Field(ge=1, le=MAX_PROCESS_TIMEOUT_MS)] | None = None
    max_output_bytes: Annotated[int, Field(ge=0)] | None = None
    output_encoding: OutputEncoding = "utf-8"
    stream: bool = False
    background: bool = False
    pty: PtySize | None = None

    @model_validator(mode="after")
    def _one_program(self) -> Self:
        if (self.command is None) == (self.argv is None):
            raise PydanticCustomError("invalid_field", "give either command (run by bash -lc) or argv, not both")
        if self.stdin is not None and self.stdin_base64 is not None:
            raise PydanticCustomError("invalid_field", "give either stdin or stdin_base64, not both")
        if len(self.stdin_bytes() or b"") > MAX_STDIN_BYTES:
            raise PydanticCustomError("invalid_field", "stdin is at most {limit} bytes", {"limit": MAX_STDIN_BYTES})
        size = sum(len(part.encode()) + 1 for part in [*self.program(), self.cwd])
        size += sum(len(name) + len(value.encode()) + 2 for name, value in self.env.items())
        if size > MAX_COMMAND_BYTES:
            raise PydanticCustomError(
                "invalid_field",
                "the command, its env and cwd are {size} bytes; at most {limit} (pass data through stdin or a file)",
                {"size": size, "limit": MAX_COMMAND_BYTES},
            )
        return self

    def program(self) -> list[str]:
        """What is executed: ``argv``, or bash running ``command`` as a login shell."""
        return list(self.argv) if self.argv is not None else ["bash", "-lc", self.command or ""]

    def stdin_bytes(self) -> bytes | None:
        if self.stdin_base64 is not None:
            return base64.b64decode(self.stdin_base64)
        return None if self.stdin is None else self.stdin.encode()


class ProcessList(_Action):
    result: ClassVar[type[BaseModel]] = r.ProcessListing
    runs_apart: ClassVar[bool] = True

    type: Literal["process_list"]


class ProcessWait(_Action):
    result: ClassVar[type[BaseModel]] = r.ProcessWaited
    runs_apart: ClassVar[bool] = True

    type: Literal["process_wait"]
    pid: Pid
    timeout_ms: Annotated[int, Field(ge=0, le=MAX_PROCESS_TIMEOUT_MS)] = 30_000


SignalName = Annotated[str, Field(pattern=r"^(SIG)?[A-Z0-9+-]{2,12}$")] | Annotated[int, Field(ge=1, le=64)]


class ProcessKill(_Action):
    """SIGKILL (the default) ends the whole tree; other signals go to the process's group."""

    result: ClassVar[type[BaseModel]] = r.Signalled

    runs_apart: ClassVar[bool] = True
    type: Literal["process_kill"]
    pid: Pid
    signal: SignalName = "SIGKILL"


class ProcessWrite(_Action):
    result: ClassVar[type[BaseModel]] = r.StdinWritten
    runs_apart: ClassVar[bool] = True

    type: Literal["process_write"]
    pid: Pid
    data: Utf8Text | None = None
    data_base64: Base64Text | None = None
    eof: bool = False

    @model_validator(mode="after")
    def _one_payload(self) -> Self:
        if self.data is not None and self.data_base64 is not None:
            raise PydanticCustomError("invalid_field", "give either data or data_base64, not both")
        if len(self.payload()) > MAX_STDIN_BYTES:
            raise PydanticCustomError("invalid_field", "data is at most {limit} bytes", {"limit": MAX_STDIN_BYTES})
        return self

    def payload(self) -> bytes:
        if self.data_base64 is not None:
            return base64.b64decode(self.data_base64)
        return (self.data or "").encode()


class ProcessOutput(_Action):
    result: ClassVar[type[BaseModel]] = r.ProcessOutputSlice
    runs_apart: ClassVar[bool] = True

    type: Literal["process_output"]
    pid: Pid
    stream: Stream = "stdout"
    offset: Annotated[int, Field(ge=0)] = 0
    max_bytes: Annotated[int, Field(ge=1, le=8 << 20)] = 1 << 20
    output_encoding: OutputEncoding = "utf-8"


class ProcessResize(_Action):
    result: ClassVar[type[BaseModel]] = r.Resized
    runs_apart: ClassVar[bool] = True

    type: Literal["process_resize"]
    pid: Pid
    rows: Annotated[int, Field(ge=1, le=1_000)]
    cols: Annotated[int, Field(ge=1, le=1_000)]


ProcessAction = Exec | ProcessList | ProcessWait | ProcessKill | ProcessWrite | ProcessOutput | ProcessResize
"""The actions carried out by :class:`corral.sandbox.agent.processes.ProcessTable`, outside the desktop's lock."""
PROCESS_ACTIONS: tuple[type[_Action], ...] = get_args(ProcessAction)


# -- tools over commands and files: a persistent shell, a text editor, patches, search -------------------------
# The vendors' shell, editor and patch tools (corral.protocol.vendor) translate to these; native clients
# may send them too. All run as the agent's uid, outside the desktop's lock (docs/protocol.md, "Tools").

SHELL_TIMEOUT_MS = 120_000  # the reference bash tool's 120 s
MAX_TOOL_OUTPUT_CHARS = 16_000  # the reference tools' cut (their MAX_RESPONSE_LEN), with a note saying so
# The note after a cut (anthropic-quickstarts, computer-use-demo tools/run.py, TRUNCATED_MESSAGE): the
# editor and the persistent shell both end a cut output with it, as the reference's tools do.
TRUNCATED_NOTE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. "
    "You should retry this tool after you have searched inside the file with `grep -n` "
    "in order to find the line numbers of what you are looking for.</NOTE>"
)


class Shell(_Action):
    """A command in the session's one persistent bash, as the agent: its working directory, exported
    variables and functions survive between calls, and stdout and stderr come interleaved, as a
    terminal shows them (``split_stderr``: apart, stderr in the result's ``stderr``, as Anthropic's
    reference bash tool keeps them). ``restart`` starts a fresh bash first (alone: only that). A
    command still running at ``timeout_ms`` fails with ``timeout``; its whole tree is killed and the
    shell restarted."""

    result: ClassVar[type[BaseModel]] = r.ShellOutput

    runs_apart: ClassVar[bool] = True
    type: Literal["shell"]
    command: Annotated[CleanText, Field(min_length=1, max_length=MAX_COMMAND_BYTES)] | None = None
    restart: bool = False
    timeout_ms: Annotated[int, Field(ge=1, le=MAX_PROCESS_TIMEOUT_MS)] = SHELL_TIMEOUT_MS
    max_output_chars: Annotated[int, Field(ge=0, le=1 << 24)] = MAX_TOOL_OUTPUT_CHARS
    split_stderr: bool = False

    @model_validator(mode="after")
    def _command_or_restart(self) -> Self:
        if self.command is None and not self.restart:
            raise PydanticCustomError("missing_field", "give a command, or restart: true")
        return self


EditCommand = Literal["view", "create", "str_replace", "insert", "undo_edit"]


class Edit(_Action):
    """The text editor, with the reference editor's behaviour and wording (Anthropic's
    ``str_replace_based_edit_tool``): ``view`` a file (numbered lines) or a directory (two levels),
    ``create`` a file that does not exist, ``str_replace`` exactly one match (or every one with
    ``replace_all``), ``insert`` after a line (0: at the top), ``undo_edit`` the last edit of a path."""

    result: ClassVar[type[BaseModel]] = r.ToolOutput

    runs_apart: ClassVar[bool] = True
    type: Literal["edit"]
    command: EditCommand
    path: AgentPath  # absolute
    file_text: Utf8Text | None = None  # create
    old_str: Utf8Text | None = None  # str_replace
    new_str: Utf8Text | None = None  # str_replace (absent: ""), insert
    replace_all: bool = False  # str_replace
    insert_line: Annotated[int, Field(ge=0)] | None = None  # insert
    view_range: tuple[int, int] | None = None  # view: [first, last], 1-based, last -1 for the end
    max_characters: Annotated[int, Field(ge=1, le=1 << 24)] | None = None  # view: cut the output to this


PatchOperation = Literal["create_file", "update_file", "delete_file"]


class ApplyPatch(_Action):
    """One file operation of a patch (OpenAI's ``apply_patch``): create a file, update one with a V4A
    diff, or delete one. All or nothing: a diff whose context is gone changes nothing."""

    result: ClassVar[type[BaseModel]] = r.ToolOutput

    runs_apart: ClassVar[bool] = True
    type: Literal["apply_patch"]
    operation: PatchOperation
    path: AgentPath  # absolute, or relative to /workspace
    diff: Utf8Text | None = None  # V4A; create_file: the new lines, each starting with '+'

    @model_validator(mode="after")
    def _diff_unless_delete(self) -> Self:
        if self.operation != "delete_file" and self.diff is None:
            raise PydanticCustomError(
                "missing_field", "{missing} is needed to create or update a file", {"missing": "diff"}
            )
        return self


class FileGlob(_Action):
    """Paths under ``path`` matching a doublestar pattern (``**/*.py``), newest first."""

    result: ClassVar[type[BaseModel]] = r.GlobMatches

    runs_apart: ClassVar[bool] = True
    type: Literal["file_glob"]
    pattern: Annotated[CleanText, Field(min_length=1, max_length=1_000)]
    path: AgentPath = DEFAULT_WORKDIR
    limit: Annotated[int, Field(ge=1, le=MAX_LIST_ENTRIES)] = 1_000


class FileGrep(_Action):
    """Lines matching a regular expression (ripgrep's syntax) in the files under ``path``."""

    result: ClassVar[type[BaseModel]] = r.GrepMatches

    runs_apart: ClassVar[bool] = True
    type: Literal["file_grep"]
    pattern: Annotated[CleanText, Field(min_length=1, max_length=1_000)]
    path: AgentPath = DEFAULT_WORKDIR
    glob: Annotated[CleanText, Field(min_length=1, max_length=1_000)] | None = None  # only files matching it
    ignore_case: bool = False
    limit: Annotated[int, Field(ge=1, le=MAX_LIST_ENTRIES)] = 1_000  # matching lines


ToolAction = Shell | Edit | ApplyPatch | FileGlob | FileGrep
"""Tools built over commands and files (corral.sandbox.agent.shell, corral.sandbox.tools.editor,
corral.sandbox.tools.patch, corral.sandbox.tools.search), outside the desktop's lock."""
TOOL_ACTIONS: tuple[type[_Action], ...] = get_args(ToolAction)


# -- code (a Jupyter kernel per named context, as the agent: corral.sandbox.kernels) ---------------------

MAX_CODE_BYTES = 1 << 20
CodeLanguage = Literal["python"]
ContextName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
DEFAULT_CODE_CONTEXT = "default"


class RunCode(_Action):
    """Run ``code`` in a kernel that keeps its state between calls (E2B's ``run_code``): one kernel
    per ``context``, started on first use as the agent, with exec's limits, egress and process table.
    At ``timeout_ms`` the cell is interrupted and the kernel kept; a kernel that ignores the interrupt
    is restarted (``state_lost``). See docs/protocol.md, "Code"."""

    result: ClassVar[type[BaseModel]] = r.CodeExecution

    runs_apart: ClassVar[bool] = True
    type: Literal["run_code"]
    code: Annotated[Utf8Text, Field(max_length=MAX_CODE_BYTES)]
    language: CodeLanguage = "python"
    context: ContextName = DEFAULT_CODE_CONTEXT
    timeout_ms: Annotated[int, Field(ge=1, le=MAX_PROCESS_TIMEOUT_MS)] | None = None
    max_output_bytes: Annotated[int, Field(ge=0)] | None = None  # stdout and stderr together, as exec's
    stream: bool = False  # output and result events before the reply

    @field_validator("code")
    @classmethod
    def _bounded(cls, value: str) -> str:
        if len(value.encode()) > MAX_CODE_BYTES:
            raise PydanticCustomError("invalid_field", "code is at most {limit} bytes", {"limit": MAX_CODE_BYTES})
        return value


class ListCodeContexts(_Action):
    result: ClassVar[type[BaseModel]] = r.CodeContextListing

    runs_apart: ClassVar[bool] = True
    type: Literal["list_code_contexts"]


class RestartCodeContext(_Action):
    """Start the context's kernel afresh (its variables gone); starts it if it was not running."""

    result: ClassVar[type[BaseModel]] = r.CodeContextInfo

    runs_apart: ClassVar[bool] = True
    type: Literal["restart_code_context"]
    context: ContextName = DEFAULT_CODE_CONTEXT


class RemoveCodeContext(_Action):
    """Stop the context's kernel and forget it (its memory freed)."""

    result: ClassVar[type[BaseModel]] = r.CodeContextRemoved

    runs_apart: ClassVar[bool] = True
    type: Literal["remove_code_context"]
    context: ContextName = DEFAULT_CODE_CONTEXT


CodeAction = RunCode | ListCodeContexts | RestartCodeContext | RemoveCodeContext
"""The code interpreter's actions (corral.sandbox.kernels), outside the desktop's lock."""
CODE_ACTIONS: tuple[type[_Action], ...] = get_args(CodeAction)


# -- the session's secrets (placeholders only: the sandbox never holds a value) ------------------------------


class Secrets(_Action):
    """The session's secret placeholders, name to placeholder, as every command's environment holds
    them (corral.sandbox.placeholders); the egress proxy puts each secret's value in its place."""

    result: ClassVar[type[BaseModel]] = r.SecretPlaceholders

    runs_apart: ClassVar[bool] = True
    type: Literal["secrets"]


# -- the control lease (corral.sandbox.control.lease): the agent's side of a human's takeover

MAX_CONTROL_WAIT_MS = 600_000
MAX_HELP_WAIT_MS = 3_600_000


class Control(_Action):
    """Who holds the session's control lease, and the human's hand-back note if one waits for the
    agent; with ``wait_ms``, waits that long for a human (or an exclusive CDP client) to hand back."""

    result: ClassVar[type[BaseModel]] = r.LeaseAnswer

    runs_apart: ClassVar[bool] = True
    lease: ClassVar[bool] = True
    type: Literal["control"]
    wait_ms: Annotated[int, Field(ge=0, le=MAX_CONTROL_WAIT_MS)] = 0


class RequestControl(_Action):
    """Ask a human to step in (a login, a CAPTCHA): every viewer shows ``reason`` in a banner; waits
    up to ``wait_ms`` for a human to take control and hand it back, and returns their note."""

    result: ClassVar[type[BaseModel]] = r.LeaseAnswer

    runs_apart: ClassVar[bool] = True
    lease: ClassVar[bool] = True
    type: Literal["request_control"]
    reason: Annotated[str, Field(min_length=1, max_length=500)]
    wait_ms: Annotated[int, Field(ge=0, le=MAX_HELP_WAIT_MS)] = 300_000


AnyAction = (
    Screenshot
    | Zoom
    | Click
    | MouseDown
    | MouseUp
    | Move
    | Drag
    | Scroll
    | Type
    | Key
    | Wait
    | CursorPosition
    | ClipboardGet
    | ClipboardSet
    | Navigate
    | Back
    | Forward
    | Reload
    | PageInfo
    | Tabs
    | TabNew
    | TabSwitch
    | TabClose
    | FileRead
    | FileWrite
    | FileList
    | FileStat
    | FileRemove
    | FileMove
    | Exec
    | ProcessList
    | ProcessWait
    | ProcessKill
    | ProcessWrite
    | ProcessOutput
    | ProcessResize
    | Shell
    | Edit
    | ApplyPatch
    | FileGlob
    | FileGrep
    | Secrets
    | RunCode
    | ListCodeContexts
    | RestartCodeContext
    | RemoveCodeContext
    | Control
    | RequestControl
)
"""Every native action: the one list. A new action is added here, and everything else follows from it:
validation (:data:`NativeAction`), the registry (:data:`ACTIONS`) and, through ``assert_never``, mypy's
demand for its case in :meth:`corral.sandbox.desktop.Desktop.run`."""

NativeAction = Annotated[AnyAction, Field(discriminator="type")]


# functools.cache does not hold other callers while it computes: a first request that came during
# the warm-up built the union a second time in the event loop (twice the CPU, beside Chromium's).
_NATIVE_BUILD = threading.Lock()


@functools.cache
def native_action() -> TypeAdapter[NativeAction]:
    """The one validator of :data:`NativeAction`, shared by the envelope, the dialects, the vendors' tools
    and the live view: built on first use (or by the controller's warm-up once it serves), once."""
    with _NATIVE_BUILD:  # a caller that comes during the build waits for it rather than building its own
        return _native_action()


@functools.cache
def _native_action() -> TypeAdapter[NativeAction]:
    return TypeAdapter(NativeAction)


def _type_of(model: type[BaseModel]) -> str:
    (name,) = get_args(model.model_fields["type"].annotation)
    return str(name)


ACTIONS: dict[str, type[BaseModel]] = {_type_of(model): model for model in get_args(AnyAction)}
"""The action registry, derived from :data:`AnyAction`: each ``type`` and its model."""

ACTION_TYPES: tuple[str, ...] = tuple(ACTIONS)

_EVERY: tuple[type[_Action], ...] = get_args(AnyAction)

HUMAN_INPUT: tuple[type[_Action], ...] = tuple(model for model in _EVERY if model.human_input)
"""What a viewer holding the lease may send (the actions flagged ``human_input``)."""

LEASE_TYPES: tuple[str, ...] = tuple(_type_of(model) for model in _EVERY if model.lease)
"""The ``type`` of each of the control lease's actions (flagged ``lease``), as a recording holds them."""
