"""The ``edit`` action: Anthropic's reference text editor, done as the agent's uid.

Outputs and error wording follow the reference (anthropics/anthropic-quickstarts,
``computer-use-demo/computer_use_demo/tools/edit.py``): ``cat -n``-style numbered lines, the
snippet shown after an edit, directories two levels deep without hidden entries. Where Corral
deviates, and why:

- Tabs are kept. The reference runs ``expandtabs()`` over the file before a ``str_replace`` or an
  ``insert`` and writes the expanded text back, so one edit turns every tab of a Makefile or a Go
  file into spaces. Here the text is matched and written as it is, and ``view`` shows tabs as tabs
  (so what the model copies from a view matches the file).
- ``multiple_matches`` lists the line where each occurrence starts (the reference lists the lines
  that contain the whole of ``old_str``, which is none for a multi-line ``old_str``).
- A relative path's suggestion is the path under /workspace (the reference suggests the same path).
- ``create`` makes missing parent directories.
- A directory listing is sorted by name, and unreadable subdirectories are passed over silently.
- CRLF files: the reference reads them with Python's universal newlines and writes LF back, turning
  the whole file to LF on one edit. Here CRLF is read as LF for ``view``, matching and ``insert``
  (an ``old_str`` or ``new_str`` with CRLF too), and the file is written back with CRLF when every
  one of its lines ended so (a file of mixed line ends is edited as it is).
- ``multiple_matches`` lists at most :data:`MAX_LISTED_LINES` line numbers (then how many more),
  and a message repeats at most :data:`MAX_ECHOED_CHARS` characters of ``old_str``; ``view`` shows at
  most :data:`MAX_VIEW_CHARS` of the file and :data:`MAX_NUMBERED_CHARS` of numbered text, whatever
  ``max_characters`` asks; a directory view lists at most :data:`MAX_LISTED` entries in all.
- Files over :data:`MAX_EDIT_BYTES` and files that are not UTF-8 are refused; the undo history is
  bounded (:class:`UndoHistory`). ``replace_all`` and ``max_characters`` are additions.

The text work (:func:`view_text`, :func:`replace`, :func:`insert`, ...) is pure, and run in a worker
thread (it is linear in a file of up to 10 MiB); :class:`Editor`
reads and writes through :class:`~corral.sandbox.tools.files.AgentFiles` (descriptors opened by the
launcher as the agent, writes to a temporary file renamed into place).
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
from collections import deque
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TypeVar

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.tools.agentfs import AgentFs
from corral.sandbox.tools.files import WORKSPACE, AgentFiles, TempFile, file_error, in_thread, read_window

SNIPPET_LINES = 4
TRUNCATED_MESSAGE = a.TRUNCATED_NOTE  # after a cut view, as the reference editor's (its name for it)
MAX_EDIT_BYTES = 10 << 20  # 10 MiB: a file the editor reads whole, and keeps in the undo history
MAX_LISTED = 10_000  # entries of a directory view looked at (all levels together)
# A view's text, however large ``max_characters`` is: its JSON fits a 16 MiB reply frame with room
# for the rest (a vendor reply carries it once; escapes can make a character six bytes).
MAX_VIEW_CHARS = 1 << 20  # of the file's text shown
MAX_NUMBERED_CHARS = 2 << 20  # of the numbered output built from it (numbers add 7 per line)
MAX_LISTED_LINES = 100  # line numbers a multiple_matches message lists
MAX_ECHOED_CHARS = 1_000  # of old_str repeated in a message
MAX_LINK_HOPS = 40  # as the kernel's ELOOP

T = TypeVar("T")


# -- the text work (pure) --------------------------------------------------------------------------------------


def maybe_truncate(content: str, limit: int = a.MAX_TOOL_OUTPUT_CHARS) -> str:
    """``content`` cut to ``limit`` characters with the reference's note after it."""
    return content if len(content) <= limit else content[:limit] + TRUNCATED_MESSAGE


def numbered(content: str, descriptor: str, init_line: int = 1, limit: int = a.MAX_TOOL_OUTPUT_CHARS) -> str:
    """The reference's ``_make_output``: ``content`` (cut first) as ``cat -n`` shows it. Tabs are kept.
    The numbered text is cut too, at :data:`MAX_NUMBERED_CHARS` (numbers on many short lines could
    make it several times ``limit``), with the same note."""
    lines = maybe_truncate(content, min(limit, MAX_VIEW_CHARS)).split("\n")
    out: list[str] = []
    size = 0
    for i, line in enumerate(lines):
        out.append(f"{i + init_line:6}\t{line}")
        size += len(out[-1]) + 1
        if size > MAX_NUMBERED_CHARS and i + 1 < len(lines):
            out.append(TRUNCATED_MESSAGE)
            break
    return f"Here's the result of running `cat -n` on {descriptor}:\n" + "\n".join(out) + "\n"


def _failed(code: ErrorCode, message: str, field: str | None = "action.path") -> ActionError:
    return ActionError(code, message, field)


def _check_line(line: int, first: int, last: int, message: str, field: str) -> None:
    """A line number outside [first, last] fails the action with the reference's ``message``."""
    if line < first or line > last:
        raise _failed(ErrorCode.INVALID_FIELD, message, field)


def view_text(content: str, path: str, view_range: tuple[int, int] | None, limit: int) -> str:
    """``view`` of a file: numbered lines, all or ``view_range`` ([first, last], last -1 = to the end)."""
    init_line = 1
    if view_range:
        lines = content.split("\n")
        count = len(lines)
        init_line, final_line = view_range
        shown = list(view_range)
        _check_line(
            init_line,
            1,
            count,
            f"Invalid `view_range`: {shown}. Its first element `{init_line}` should be within the range of "
            f"lines of the file: {[1, count]}",
            "action.view_range",
        )
        if final_line > count:
            raise _failed(
                ErrorCode.INVALID_FIELD,
                f"Invalid `view_range`: {shown}. Its second element `{final_line}` should be smaller than the "
                f"number of lines in the file: `{count}`",
                "action.view_range",
            )
        if final_line != -1 and final_line < init_line:
            raise _failed(
                ErrorCode.INVALID_FIELD,
                f"Invalid `view_range`: {shown}. Its second element `{final_line}` should be larger or equal "
                f"than its first `{init_line}`",
                "action.view_range",
            )
        end = None if final_line == -1 else final_line
        content = "\n".join(lines[init_line - 1 : end])
    return numbered(content, path, init_line, limit)


def _lines_of(content: str, starts: list[int]) -> list[int]:
    """The line each of ``starts`` (ascending offsets) is on, in one pass over ``content``."""
    lines: list[int] = []
    line, last = 1, 0
    for at in starts:
        line += content.count("\n", last, at)
        last = at
        lines.append(line)
    return lines


def _listed(lines: list[int] | range) -> str:
    """The reference's ``[3, 7, 9]``, cut after :data:`MAX_LISTED_LINES` numbers with how many more."""
    if len(lines) <= MAX_LISTED_LINES:
        return str(list(lines))
    shown = ", ".join(str(line) for line in lines[:MAX_LISTED_LINES])
    return f"[{shown}, ... and {len(lines) - MAX_LISTED_LINES} more]"


def _echoed(old: str) -> str:
    """``old_str`` as a message repeats it: cut after :data:`MAX_ECHOED_CHARS` characters."""
    if len(old) <= MAX_ECHOED_CHARS:
        return old
    return f"{old[:MAX_ECHOED_CHARS]}... ({len(old)} characters)"


def _occurrences(content: str, old: str) -> list[int]:
    """Where each non-overlapping occurrence of ``old`` starts (as ``str.count`` counts them)."""
    found: list[int] = []
    at = content.find(old)
    while at != -1:
        found.append(at)
        at = content.find(old, at + max(1, len(old)))
    return found


def replace(content: str, path: str, old: str, new: str, replace_all: bool = False) -> tuple[str, str]:
    """``str_replace``: the new text and the reference's message (a snippet around the first edit)."""
    if not old:
        return _replace_empty(content, path, new, replace_all)
    starts = _occurrences(content, old)
    if not starts:
        raise _failed(
            ErrorCode.NO_MATCH,
            f"No replacement was performed, old_str `{_echoed(old)}` did not appear verbatim in {path}.",
            "action.old_str",
        )
    if len(starts) > 1 and not replace_all:
        lines = sorted(set(_lines_of(content, starts)))
        raise _failed(
            ErrorCode.MULTIPLE_MATCHES,
            f"No replacement was performed. Multiple occurrences of old_str `{_echoed(old)}` in lines "
            f"{_listed(lines)}. "
            "Please ensure it is unique",
            "action.old_str",
        )
    new_content = content.replace(old, new)
    return new_content, _edited(path, new_content, content[: starts[0]].count("\n"), new, len(starts))


def _replace_empty(content: str, path: str, new: str, replace_all: bool) -> tuple[str, str]:
    """An empty ``old_str``: the reference counts it once in an empty file (which it then fills) and
    once per position in any other (several: refused, naming every line)."""
    if replace_all:
        raise _failed(ErrorCode.INVALID_FIELD, "old_str cannot be empty with replace_all", "action.old_str")
    if content:
        lines = range(1, content.count("\n") + 2)
        raise _failed(
            ErrorCode.MULTIPLE_MATCHES,
            f"No replacement was performed. Multiple occurrences of old_str `` in lines {_listed(lines)}. "
            "Please ensure it is unique",
            "action.old_str",
        )
    return new, _edited(path, new, 0, new)


def _edited(path: str, new_content: str, replacement_line: int, new: str, count: int = 1) -> str:
    """The reference's answer to a ``str_replace``: a snippet around the (first) replaced line."""
    start_line = max(0, replacement_line - SNIPPET_LINES)
    end_line = replacement_line + SNIPPET_LINES + new.count("\n")
    snippet = "\n".join(new_content.split("\n")[start_line : end_line + 1])
    done = "has been edited. " if count == 1 else f"has been edited: {count} occurrences of old_str were replaced. "
    return (
        f"The file {path} {done}"
        + numbered(snippet, f"a snippet of {path}", start_line + 1)
        + "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )


def insert(content: str, path: str, insert_line: int, new: str) -> tuple[str, str]:
    """``insert``: ``new`` after line ``insert_line`` (0: at the top); the new text and the message."""
    lines = content.split("\n")
    count = len(lines)
    _check_line(
        insert_line,
        0,
        count,
        f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of the file: "
        f"{[0, count]}",
        "action.insert_line",
    )
    new_lines = new.split("\n")
    result = lines[:insert_line] + new_lines + lines[insert_line:]
    snippet = lines[max(0, insert_line - SNIPPET_LINES) : insert_line] + new_lines
    snippet += lines[insert_line : insert_line + SNIPPET_LINES]
    message = (
        f"The file {path} has been edited. "
        + numbered("\n".join(snippet), "a snippet of the edited file", max(1, insert_line - SNIPPET_LINES + 1))
        + "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). "
        "Edit the file again if necessary."
    )
    return "\n".join(result), message


def listing_text(path: str, found: list[str]) -> str:
    """A directory's ``view``: ``find PATH -maxdepth 2 -not -path '*/.*'``'s lines under the reference's header."""
    stdout = maybe_truncate("".join(f"{line}\n" for line in [path, *found]))
    return f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n{stdout}\n"


def undone(path: str, text: str) -> str:
    return f"Last edit to {path} undone successfully. {numbered(text, path)}"


# -- the undo history ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UndoLimits:
    per_path: int = 10  # edits of one path that can be undone
    entries: int = 1_000  # of all paths
    # UTF-8 bytes of the texts held, all paths together. Texts are kept encoded: a str with one astral
    # character costs 4 bytes per character, so counting characters let the memory run 4x past this.
    bytes: int = 64 << 20


class UndoHistory:
    """What each path held before its last edits, newest last, in the controller's memory. Bounded
    (:class:`UndoLimits`): past a limit the oldest entries (of any path) are forgotten first."""

    def __init__(self, limits: UndoLimits | None = None) -> None:
        self._limits = limits or UndoLimits()
        self._by_path: dict[str, deque[bytes]] = {}
        self._order: deque[str] = deque()  # the path of every entry, oldest first
        self._bytes = 0

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def push(self, path: str, text: str) -> None:
        data = text.encode()
        entries = self._by_path.setdefault(path, deque())
        entries.append(data)
        self._order.append(path)
        self._bytes += len(data)
        if len(entries) > self._limits.per_path:
            self._bytes -= len(entries.popleft())
            self._order.remove(path)  # its first mention is its oldest entry
        while self._order and (len(self._order) > self._limits.entries or self._bytes > self._limits.bytes):
            oldest = self._order.popleft()
            self._bytes -= len(self._by_path[oldest].popleft())
            if not self._by_path[oldest]:
                del self._by_path[oldest]

    def pop(self, path: str) -> str | None:
        entries = self._by_path.get(path)
        if not entries:
            return None
        data = entries.pop()
        self._bytes -= len(data)
        if not entries:
            del self._by_path[path]
        # Its last mention in the order is this entry.
        index = len(self._order) - 1 - list(reversed(self._order)).index(path)
        del self._order[index]
        return data.decode()

    def __len__(self) -> int:
        return len(self._order)


# -- the editor over the agent's files --------------------------------------------------------------------------


def _shown(path: str) -> str:
    """The path as the reference prints it: ``str(Path(path))`` (no doubled or trailing slash)."""
    return str(PurePosixPath(path))


class Editor:
    """The ``edit`` action as the agent (``files``, ``fs``: the launcher), with its undo history."""

    def __init__(self, files: AgentFiles, fs: AgentFs, history: UndoHistory | None = None) -> None:
        self._files = files
        self._fs = fs
        self.history = UndoHistory() if history is None else history
        # Edits and patches run apart from the desktop and from each other's requests: one at a time
        # here, so a read-modify-write never interleaves with another one (nor with the history).
        self.lock = asyncio.Lock()

    async def run(self, action: a.Edit) -> r.ToolOutput:
        path = action.path
        if not os.path.isabs(path):
            raise _failed(
                ErrorCode.INVALID_FIELD,
                f"The path {path} is not an absolute path, it should start with `/`. "
                f"Maybe you meant {posixpath.join(WORKSPACE, path)}?",
            )
        shown = _shown(path)
        try:
            async with self.lock:
                output = await self._command(action, shown)
        except OSError as exc:
            raise file_error(exc, "action.path") from None
        return r.ToolOutput(output=output, path=shown)

    async def _command(self, action: a.Edit, path: str) -> str:
        kind = await self._kind(path)
        if kind is None and action.command != "create":
            raise _failed(ErrorCode.NO_SUCH_FILE, f"The path {path} does not exist. Please provide a valid path.")
        if kind is not None and action.command == "create":
            raise _failed(ErrorCode.FILE_EXISTS, _exists_message(path))
        if kind == "directory" and action.command != "view":
            raise _failed(
                ErrorCode.IS_A_DIRECTORY,
                f"The path {path} is a directory and only the `view` command can be used on directories",
            )
        match action.command:
            case "view":
                if kind == "directory":
                    return await self._view_directory(action, path)
                limit = min(action.max_characters or a.MAX_TOOL_OUTPUT_CHARS, MAX_VIEW_CHARS)
                text = as_lf(await self.read(path))
                return await in_thread(view_text, text, path, action.view_range, limit)
            case "create":
                text = _required(action.file_text, "file_text", "create")
                try:
                    await self.write(path, text, make_dirs=True, replace=False)
                except FileExistsError:  # made since it was looked for: the rename does not replace it
                    raise _failed(ErrorCode.FILE_EXISTS, _exists_message(path)) from None
                self.history.push(path, text)
                return f"File created successfully at: {path}"
            case "str_replace":
                old = _required(action.old_str, "old_str", "str_replace")
                content = await self.read(path)
                new_content, message = await in_thread(
                    replace, as_lf(content), path, as_lf(old), as_lf(action.new_str or ""), action.replace_all
                )
                await self.write(path, with_line_ends_of(content, new_content))
                self.history.push(path, content)
                return message
            case "insert":
                line = _required(action.insert_line, "insert_line", "insert")
                new = _required(action.new_str, "new_str", "insert")
                content = await self.read(path)
                new_content, message = await in_thread(insert, as_lf(content), path, line, as_lf(new))
                await self.write(path, with_line_ends_of(content, new_content))
                self.history.push(path, content)
                return message
            case "undo_edit":
                previous = self.history.pop(path)
                if previous is None:
                    raise _failed(ErrorCode.NOTHING_TO_UNDO, f"No edit history found for {path}.")
                try:
                    await self.write(path, previous)
                except BaseException:
                    self.history.push(path, previous)  # not undone: it can be tried again
                    raise
                return await in_thread(undone, path, as_lf(previous))

    async def _kind(self, path: str) -> str | None:
        try:
            return (await self._fs.stat(path)).type
        except FileNotFoundError:
            return None

    async def _view_directory(self, action: a.Edit, path: str) -> str:
        if action.view_range:
            raise _failed(
                ErrorCode.INVALID_FIELD,
                "The `view_range` parameter is not allowed when `path` points to a directory.",
                "action.view_range",
            )
        found: list[str] = []
        top, _ = await self._files.listing(path, False, None, MAX_LISTED)
        for item in top:
            if len(found) >= MAX_LISTED:
                break  # the whole listing is bounded, not each directory of it
            if item.name.startswith("."):
                continue
            found.append(posixpath.join(path, item.name))
            if item.type == "directory":
                try:
                    below, _ = await self._files.listing(item.path, False, None, MAX_LISTED - len(found))
                except OSError:
                    continue  # find says so on stderr; the listing goes on without it
                found += [posixpath.join(path, item.name, sub.name) for sub in below if not sub.name.startswith(".")]
        return listing_text(path, found[:MAX_LISTED])

    # -- reading and writing as the agent -------------------------------------------------------------------

    async def read(self, path: str) -> str:
        """The whole of a text file, as the agent reads it (symlinks followed by the kernel, as the agent)."""
        fd = await self._files.open_regular(path)
        try:
            size = os.fstat(fd).st_size
            if size > MAX_EDIT_BYTES:
                raise _failed(
                    ErrorCode.TOO_LARGE,
                    f"{path} is {size} bytes; the editor takes files of at most {MAX_EDIT_BYTES} bytes "
                    "(read it in windows with file_read, search it with file_grep)",
                )
            data = await in_thread(read_window, fd, 0, MAX_EDIT_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_EDIT_BYTES:
            raise _failed(ErrorCode.TOO_LARGE, f"{path} grew over {MAX_EDIT_BYTES} bytes while it was read")
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise _failed(
                ErrorCode.INVALID_REQUEST,
                f"{path} is not UTF-8 text (byte {exc.start}): the editor edits text files only "
                "(read it with file_read and encoding 'base64')",
            ) from None

    async def write(self, path: str, text: str, *, make_dirs: bool = False, replace: bool = True) -> None:
        """``text`` put in place at ``path`` (through a symlink to its target, as the reference's
        ``write_text`` does): a temporary file renamed over the target, the target's mode kept.
        ``replace=False``: the rename fails (FileExistsError) if the target is there by then."""
        target = await self.target_of(path)
        data = text.encode()

        async def fill(out: TempFile) -> None:
            await out.write(data)

        try:
            await self._files.write(target, fill, make_dirs=make_dirs, replace=replace)
        except PermissionError as exc:
            raise _denied(path, target, exc) from None

    async def target_of(self, path: str) -> str:
        """Where a write to ``path`` lands: a symlink as the last component is followed (as the agent
        sees it), so the rename replaces its target and not the link."""
        for _ in range(MAX_LINK_HOPS):
            try:
                found = await self._fs.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                return path
            if found.type != "symlink" or found.target is None:
                return path
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), found.target))
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)


def _denied(path: str, target: str, exc: PermissionError) -> ActionError:
    """A write the agent's uid may not make, said as what stopped it: the file itself (read-only,
    another uid's) or its directory (where the new text is written first, then renamed over it)."""
    named = os.fsdecode(exc.filename) if exc.filename is not None else target
    directory = posixpath.dirname(target) or "/"
    reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or "Permission denied")
    at_fault = os.fsdecode(exc.filename2) if exc.filename2 is not None else None
    if at_fault == directory:  # the temporary file could not be made (AgentFiles names the directory)
        why = f"the agent may not create files in {directory}, where the new text is written before it replaces {path}"
    elif named == target:
        why = "the agent may not write this file (its mode, or its owner), so the editor does not either"
    elif named == directory or posixpath.dirname(named) == directory:
        why = f"the agent may not create files in {directory}, where the new text is written before it replaces {path}"
    else:
        why = f"the agent may not write {named}"
    return _failed(ErrorCode.PERMISSION_DENIED, f"{path}: {reason}: {why}")


def _exists_message(path: str) -> str:
    return f"File already exists at: {path}. Cannot overwrite files using command `create`."


def as_lf(text: str) -> str:
    """CRLF line ends read as LF: a CRLF file is viewed, matched and edited as the model sees text."""
    return text.replace("\r\n", "\n") if "\r\n" in text else text


def with_line_ends_of(original: str, text: str) -> str:
    """``text`` (LF) written back with ``original``'s line ends: CRLF when every line of it ended so."""
    newlines = original.count("\n")
    return text.replace("\n", "\r\n") if newlines and original.count("\r\n") == newlines else text


def _required(value: T | None, name: str, command: str) -> T:
    if value is None:
        raise _failed(
            ErrorCode.MISSING_FIELD, f"Parameter `{name}` is required for command: {command}", f"action.{name}"
        )
    return value
