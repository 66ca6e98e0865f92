"""The V4A diff of OpenAI's ``apply_patch`` tool, parsed and applied to text (pure: no I/O).

An ``apply_patch_call`` carries one file operation; its ``diff`` is the body of that file's section
of a codex patch (github:openai/codex, ``codex-rs/apply-patch``): for ``update_file`` a run of
chunks, each an optional ``@@`` header (``@@`` alone, or ``@@ <a line to find first>``, e.g. a
``def``), then lines starting with ``' '`` (context), ``'-'`` (removed) or ``'+'`` (added), the last
chunk optionally closed by ``*** End of File`` (its lines are at the end of the file); for
``create_file`` the new file's lines, each starting with ``'+'``.

Lenient where codex is: a whole ``*** Begin Patch`` envelope with one file's header is accepted,
an empty line in a chunk is an empty context line, and lines are found by codex's
``seek_sequence`` passes (exact, then ignoring trailing whitespace, then leading and trailing, then
with typographic dashes, quotes and odd spaces read as their ASCII forms). Strict where a wrong edit
could follow: the chunks must be found in order, each below the previous one, and a chunk that is
not found fails the whole diff (nothing is applied), its error naming the lines not found.
Where the two references differ, codex is followed (the model's own reference; docs/protocol.md,
"apply_patch and codex", lists what is done otherwise): an update writes the file back with every
line terminated (a file without a final newline gets one), each untouched line keeps its own line
end, and the lines it writes take the file's first line end (the diff's own where the file has
none: an empty file patched with a CRLF diff is CRLF, as in agents-python's ``apply_diff``);
``create_file`` writes the diff's own line ends, every line terminated, and a final bare ``+``
stands for the final newline (agents-python), not for one more empty line. Stacked ``@@`` headers
(``@@ class B:`` then ``@@     def f(self):``) are found in turn; an outermost header that names a
line already passed (a parent reused by the next chunk) narrows nothing and is not an error
(agents-python); added lines after a header go right below its line, a headerless chunk of added
lines at the end of the file (codex). An envelope's file header must be the operation's own (an
``*** Add File:`` sent as ``update_file`` is refused, never read as lines to append), and codex's
``*** Move to:`` is refused: the call names one path, the one a caller approved.
Finding is bounded: candidates come from the pattern's rarest line, each pass normalises the file
once, and past :data:`MAX_COMPARISONS` line comparisons the diff is refused as too ambiguous.
Failures are :class:`~corral.errors.ActionError`: ``invalid_field`` for a malformed diff,
``patch_failed`` for context not found, both about ``action.diff``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from corral.errors import ActionError, ErrorCode

BEGIN_PATCH = "*** Begin Patch"
END_PATCH = "*** End Patch"
END_OF_FILE = "*** End of File"
FILE_HEADERS = ("*** Update File: ", "*** Add File: ", "*** Delete File: ")
MOVE_TO = "*** Move to: "
DIFF_FIELD = "action.diff"

# codex's seek_sequence, last pass: typographic punctuation read as ASCII.
_ASCII = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000", " "),
    }
)


def _malformed(message: str) -> ActionError:
    """The diff is not V4A (a line of it is malformed): nothing can be applied."""
    return ActionError(ErrorCode.INVALID_FIELD, f"invalid diff: {message}", DIFF_FIELD)


def _not_found(message: str) -> ActionError:
    """The diff is well formed but its context is not in the file: nothing is applied."""
    return ActionError(ErrorCode.PATCH_FAILED, message, DIFF_FIELD)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One ``@@`` section: ``old`` lines (context and removed) become ``new`` (context and added)."""

    header: str | None  # the line after "@@ ", found before the chunk's lines are looked for
    old: tuple[str, ...]
    new: tuple[str, ...]
    end_of_file: bool = False
    line: int = 1  # where the chunk starts in the diff, for errors
    # For each of ``new``: the index in ``old`` of the context line it is (None: an added line).
    # A context line keeps the file's own text, so a loose match never rewrites its whitespace.
    kept: tuple[int | None, ...] = ()
    # Stacked headers above ``header`` (``@@ class B:`` then ``@@     def f(self):``), outermost
    # first: each is found in turn, below the one before it, to narrow where ``header`` is looked for.
    outer: tuple[str, ...] = ()


# -- parsing ---------------------------------------------------------------------------------------------------


def _diff_lines(diff: str, header: str) -> list[str]:
    """The diff's lines (CRLF read as LF), the envelope of a whole one-file patch taken off. Its
    file header must be ``header`` (the operation's own): an ``*** Add File:`` section sent as an
    ``update_file`` is refused rather than read as lines to append."""
    lines = diff.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if lines and lines[0].strip() == BEGIN_PATCH:
        lines = lines[1:]
        if lines and lines[-1].strip() == END_PATCH:
            lines = lines[:-1]
        if lines and lines[0].strip().startswith(FILE_HEADERS):
            given = lines[0].strip()
            if not given.startswith(header.strip()):
                kind = given.split(":", 1)[0]
                raise _malformed(f"line 2: {kind!r} does not fit this operation (it takes {header.strip()!r})")
            lines = lines[1:]
    if lines and lines[0].startswith(MOVE_TO):
        # The operation names its one path (what a caller approved): a diff never reaches another.
        raise _malformed(f"line 1: {MOVE_TO.strip()!r} is not supported here; delete the file and create the new one")
    return lines


def parse_create(diff: str) -> str:
    """The new file of a ``create_file`` diff: each line without its ``'+'``, each ending with a
    newline (the diff's own line end). A last line that is a bare ``'+'`` is the final newline of
    the line before it (agents-python's ``apply_diff``), not an empty line more."""
    newline = newline_of(diff)
    lines = _diff_lines(diff, FILE_HEADERS[1])
    if lines and lines[-1] == "+":
        lines.pop()
    out: list[str] = []
    for number, line in enumerate(lines, 1):
        if line.startswith("+"):
            out.append(line[1:] + newline)
        elif line == "":
            out.append(newline)
        else:
            raise _malformed(
                f"line {number} of the diff does not start with '+': {line!r} (every line of a new file does)"
            )
    return "".join(out)


def newline_of(text: str) -> str:
    """The line end ``text`` uses: CRLF if its first line ends so, else LF."""
    first = text.find("\n")
    return "\r\n" if first > 0 and text[first - 1] == "\r" else "\n"


def parse_update(diff: str) -> list[Chunk]:
    """The chunks of an ``update_file`` diff, in order."""
    return _chunks(_diff_lines(diff, FILE_HEADERS[0]))


def _chunks(lines: list[str]) -> list[Chunk]:
    chunks: list[Chunk] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() == "" and (index + 1 == len(lines) or lines[index + 1].startswith("@@")):
            index += 1  # a blank line between chunks
            continue
        chunk, index = _parse_chunk(lines, index, first=not chunks)
        chunks.append(chunk)
    if not chunks:
        raise _malformed("the diff has no changes (give @@ chunks of ' ', '-' and '+' lines)")
    return chunks


def _parse_chunk(lines: list[str], start: int, *, first: bool) -> tuple[Chunk, int]:
    headers: list[str] = []
    index = start
    while index < len(lines) and (lines[index].strip() == "@@" or lines[index].startswith("@@ ")):
        if named := lines[index][3:].strip():
            headers.append(named)
        index += 1
    if index == start and not first:
        raise _malformed(f"line {start + 1}: expected an @@ header, got {lines[start]!r}")
    header = headers.pop() if headers else None
    old: list[str] = []
    new: list[str] = []
    kept: list[int | None] = []
    end_of_file = False
    changed = 0
    while index < len(lines):
        line = lines[index]
        if line.strip() == END_OF_FILE:
            end_of_file = True
            index += 1
            break
        if line.startswith("@@"):
            break
        kind, text = (line[:1], line[1:]) if line else (" ", "")
        if kind == " ":
            kept.append(len(old))
            old.append(text)
            new.append(text)
        elif kind == "-":
            old.append(text)
        elif kind == "+":
            kept.append(None)
            new.append(text)
        elif line.startswith("***"):
            raise _malformed(f"line {index + 1}: {line!r} is not allowed here (one file's changes per diff)")
        else:
            raise _malformed(
                f"line {index + 1}: {line!r} does not start with ' ' (context), '-' (removed) or '+' (added)"
            )
        changed += 1
        index += 1
    if changed == 0:
        raise _malformed(f"line {start + 1}: the chunk has no lines")
    return Chunk(header, tuple(old), tuple(new), end_of_file, start + 1, tuple(kept), tuple(headers)), index


# -- finding and applying ------------------------------------------------------------------------------------


# seek_sequence's passes, strictest first.
_NORMALISERS: tuple[Callable[[str], str], ...] = (
    lambda line: line,
    str.rstrip,
    str.strip,
    lambda line: line.strip().translate(_ASCII),
)


MAX_COMPARISONS = 4_000_000  # line comparisons one diff may spend finding its chunks (a second or so)


class _Budget:
    """The line comparisons left to one diff: a diff whose context could sit at a great many places
    (a file of repeated lines) is refused instead of holding the controller for minutes."""

    def __init__(self, comparisons: int = MAX_COMPARISONS) -> None:
        self.left = comparisons

    def spend(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise _not_found(
                "the diff's context is too ambiguous to place (it matches the file in too many places): "
                "give more distinctive context lines or an @@ header"
            )


class Lines:
    """A file's lines with, per seek pass, each line normalised once and where each normalised line
    is (so a pattern's candidate positions come from its rarest line, not from a scan of the file)."""

    def __init__(self, lines: list[str], budget: _Budget | None = None) -> None:
        self.lines = lines
        self.budget = budget or _Budget()
        self._passes: dict[int, tuple[list[str], dict[str, list[int]]]] = {}

    def normalised(self, which: int) -> tuple[list[str], dict[str, list[int]]]:
        if which not in self._passes:
            norm = _NORMALISERS[which]
            texts = self.lines if which == 0 else [norm(line) for line in self.lines]
            where: dict[str, list[int]] = {}
            for at, text in enumerate(texts):
                where.setdefault(text, []).append(at)
            self.budget.spend(len(texts) // 16)  # building the pass costs far less than comparing
            self._passes[which] = (texts, where)
        return self._passes[which]


def seek(lines: list[str] | Lines, pattern: tuple[str, ...], start: int, end_of_file: bool = False) -> int | None:
    """Where ``pattern`` starts in ``lines`` at or after ``start`` (codex's ``seek_sequence``): each
    pass looks through all of the file before the next, looser one. ``end_of_file``: at the very end
    first. Bounded: past :data:`MAX_COMPARISONS` line comparisons, ``patch_failed``."""
    file = lines if isinstance(lines, Lines) else Lines(lines)
    if not pattern:
        return start
    if len(pattern) > len(file.lines):
        return None
    last = len(file.lines) - len(pattern)
    first = last if end_of_file else start
    for which, norm in enumerate(_NORMALISERS):
        texts, where = file.normalised(which)
        wanted = [norm(p) for p in pattern]
        # Anchor on the pattern's rarest line: its positions are the only places the pattern can start.
        anchor = min(range(len(wanted)), key=lambda k: len(where.get(wanted[k], ())))
        positions = where.get(wanted[anchor], [])
        for found in positions[bisect.bisect_left(positions, first + anchor) :]:
            at = found - anchor
            if at > last:
                break
            compared = 0
            for k, want in enumerate(wanted):
                compared += 1
                if texts[at + k] != want:
                    break
            else:
                file.budget.spend(compared)
                return at
            file.budget.spend(compared)
    if end_of_file and start < first:
        return seek(file, pattern, start)
    return None


# One replacement: where in the file, how many of its lines, and the new lines, each its text and the
# file line it keeps (a context line: None for an added line).
Replacement = tuple[int, int, tuple[tuple[str, int | None], ...]]


def _replacements(lines: list[str], chunks: list[Chunk], path: str) -> list[Replacement]:
    out: list[Replacement] = []
    file = Lines(lines)
    cursor = 0
    for number, chunk in enumerate(chunks, 1):
        headers = (*chunk.outer, *(() if chunk.header is None else (chunk.header,)))
        for depth, header in enumerate(headers):  # stacked headers: each in turn, below the one before
            found = seek(file, (header,), cursor)
            if found is None and depth == 0 and cursor > 0 and seek(file, (header,), 0) is not None:
                continue  # a parent already passed (the chunk before was inside it): agents-python's rule
            if found is None:
                raise _not_found(
                    f"chunk {number} (diff line {chunk.line}): the line '@@ {header}' names was not found in "
                    f"{path}" + (f" below line {cursor}" if cursor else "")
                )
            cursor = found + 1
        if not chunk.old:
            # Only added lines: at the end of the file when the chunk has no header (codex), else
            # right after the header's line (where agents-python's apply_diff puts them).
            at = cursor if chunk.header is not None and not chunk.end_of_file else len(lines)
            out.append((at, 0, tuple((text, None) for text in chunk.new)))
            continue
        old, new = chunk.old, chunk.new
        found = seek(file, old, cursor, chunk.end_of_file)
        if found is None and old[-1] == "":
            # A trailing empty line that stands for the file's final newline (codex retries without it).
            old, new = old[:-1], new[:-1] if new and new[-1] == "" else new
            found = seek(file, old, cursor, chunk.end_of_file) if old else None
        if found is None:
            where = " at the end of the file" if chunk.end_of_file else ""
            shown = "\n".join(chunk.old)
            raise _not_found(
                f"chunk {number} (diff line {chunk.line}): these lines were not found in {path}{where}"
                + (f" below line {cursor}" if cursor else "")
                + f":\n{shown}"
            )
        kept = chunk.kept or (None,) * len(new)
        fresh = tuple(
            (text, None) if k is None or k >= len(old) else (lines[found + k], found + k)
            for text, k in zip(new, kept, strict=False)
        )
        out.append((found, len(old), fresh))
        cursor = found + len(old)
    return sorted(out, key=lambda item: item[0])


def split_lines(text: str) -> tuple[list[str], list[str | None]]:
    """``text``'s lines without their ends, and each one's end (``"\\n"``, ``"\\r\\n"``, or None for
    a last line without one)."""
    parts = text.split("\n")
    last = parts.pop()
    texts: list[str] = []
    ends: list[str | None] = []
    for part in parts:
        crlf = part.endswith("\r")
        texts.append(part[:-1] if crlf else part)
        ends.append("\r\n" if crlf else "\n")
    if last:
        texts.append(last)
        ends.append(None)
    return texts, ends


def apply_chunks(text: str, chunks: list[Chunk], path: str = "the file", newline: str = "\n") -> str:
    """``text`` with every chunk applied, or ``patch_failed`` (and nothing applied), line ends as
    codex keeps them (codex-rs/apply-patch, text_file.rs): a line left alone keeps its own end, a
    line written takes the file's first line end (``newline``, the diff's, in a file that has none),
    and every line ends with one (a file without a final newline gets it)."""
    lines, ends = split_lines(text)
    preferred = next((end for end in ends if end is not None), newline)
    out: list[str] = []
    cursor = 0
    for at, length, new in _replacements(lines, chunks, path):
        if at < cursor:
            raise _not_found(f"two chunks change the same lines of {path} (near line {at + 1})")
        out.extend(line + (end or preferred) for line, end in zip(lines[cursor:at], ends[cursor:at], strict=True))
        out.extend(line + ((ends[kept] if kept is not None else None) or preferred) for line, kept in new)
        cursor = at + length
    out.extend(line + (end or preferred) for line, end in zip(lines[cursor:], ends[cursor:], strict=True))
    return "".join(out)


def apply_update(text: str, diff: str, path: str = "the file") -> str:
    """``text`` with an ``update_file`` diff applied: ``invalid_field`` or ``patch_failed`` if not."""
    return apply_chunks(text, parse_update(diff), path, newline_of(diff))
