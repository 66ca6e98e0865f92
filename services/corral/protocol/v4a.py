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
The result ends with a newline (as codex writes it); a file with CRLF line ends keeps them.
Failures are :class:`~corral.errors.ActionError`: ``invalid_field`` for a malformed diff,
``patch_failed`` for context not found, both about ``action.diff``.
"""

from __future__ import annotations

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


# -- parsing ---------------------------------------------------------------------------------------------------


def _diff_lines(diff: str) -> list[str]:
    """The diff's lines (CRLF read as LF), the envelope of a whole one-file patch taken off."""
    lines = diff.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if lines and lines[0].strip() == BEGIN_PATCH:
        lines = lines[1:]
        if lines and lines[-1].strip() == END_PATCH:
            lines = lines[:-1]
        if lines and lines[0].strip().startswith(FILE_HEADERS):
            lines = lines[1:]
    if lines and lines[0].startswith(MOVE_TO):
        raise _malformed(f"line 1: {MOVE_TO.strip()!r} is not supported here; delete the file and create the new one")
    return lines


def parse_create(diff: str) -> str:
    """The new file of a ``create_file`` diff: each line without its ``'+'``, each ending with a newline."""
    out: list[str] = []
    for number, line in enumerate(_diff_lines(diff), 1):
        if line.startswith("+"):
            out.append(line[1:] + "\n")
        elif line == "":
            out.append("\n")
        else:
            raise _malformed(
                f"line {number} of the diff does not start with '+': {line!r} (every line of a new file does)"
            )
    return "".join(out)


def parse_update(diff: str) -> list[Chunk]:
    """The chunks of an ``update_file`` diff, in order."""
    lines = _diff_lines(diff)
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
    head = lines[start]
    header: str | None = None
    index = start
    if head.strip() == "@@":
        index += 1
    elif head.startswith("@@ "):
        header = head[3:].strip() or None
        index += 1
    elif not first:
        raise _malformed(f"line {start + 1}: expected an @@ header, got {head!r}")
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
    return Chunk(header, tuple(old), tuple(new), end_of_file, start + 1, tuple(kept)), index


# -- finding and applying ------------------------------------------------------------------------------------


# seek_sequence's passes, strictest first.
_NORMALISERS: tuple[Callable[[str], str], ...] = (
    lambda line: line,
    str.rstrip,
    str.strip,
    lambda line: line.strip().translate(_ASCII),
)


def seek(lines: list[str], pattern: tuple[str, ...], start: int, end_of_file: bool = False) -> int | None:
    """Where ``pattern`` starts in ``lines`` at or after ``start`` (codex's ``seek_sequence``): each
    pass looks through all of the file before the next, looser one. ``end_of_file``: at the very end
    first."""
    if not pattern:
        return start
    if len(pattern) > len(lines):
        return None
    last = len(lines) - len(pattern)
    first = last if end_of_file else start
    for norm in _NORMALISERS:
        wanted = [norm(p) for p in pattern]
        for at in range(first, last + 1):
            if all(norm(lines[at + k]) == wanted[k] for k in range(len(pattern))):
                return at
    if end_of_file and start < first:
        return seek(lines, pattern, start)
    return None


def _replacements(lines: list[str], chunks: list[Chunk], path: str) -> list[tuple[int, int, tuple[str, ...]]]:
    out: list[tuple[int, int, tuple[str, ...]]] = []
    cursor = 0
    for number, chunk in enumerate(chunks, 1):
        if chunk.header is not None:
            found = seek(lines, (chunk.header,), cursor)
            if found is None:
                raise _not_found(
                    f"chunk {number} (diff line {chunk.line}): the line '@@ {chunk.header}' names was not found in "
                    f"{path}" + (f" below line {cursor}" if cursor else "")
                )
            cursor = found + 1
        if not chunk.old:
            # Only added lines: after the header's line when there is one, else at the end (codex).
            at = cursor if chunk.header is not None and not chunk.end_of_file else len(lines)
            out.append((at, 0, chunk.new))
            continue
        old, new = chunk.old, chunk.new
        found = seek(lines, old, cursor, chunk.end_of_file)
        if found is None and old[-1] == "":
            # A trailing empty line that stands for the file's final newline (codex retries without it).
            old, new = old[:-1], new[:-1] if new and new[-1] == "" else new
            found = seek(lines, old, cursor, chunk.end_of_file) if old else None
        if found is None:
            where = " at the end of the file" if chunk.end_of_file else ""
            shown = "\n".join(chunk.old)
            raise _not_found(
                f"chunk {number} (diff line {chunk.line}): these lines were not found in {path}{where}"
                + (f" below line {cursor}" if cursor else "")
                + f":\n{shown}"
            )
        kept = chunk.kept or (None,) * len(new)
        fresh = (text if k is None or k >= len(old) else lines[found + k] for text, k in zip(new, kept, strict=False))
        out.append((found, len(old), tuple(fresh)))
        cursor = found + len(old)
    return sorted(out, key=lambda item: item[0])


def apply_chunks(text: str, chunks: list[Chunk], path: str = "the file") -> str:
    """``text`` with every chunk applied, or ``patch_failed`` (and nothing applied)."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    result: list[str] = []
    cursor = 0
    for at, length, new in _replacements(lines, chunks, path):
        if at < cursor:
            raise _not_found(f"two chunks change the same lines of {path} (near line {at + 1})")
        result.extend(lines[cursor:at])
        result.extend(new)
        cursor = at + length
    result.extend(lines[cursor:])
    return newline.join([*result, ""])


def apply_update(text: str, diff: str, path: str = "the file") -> str:
    """``text`` with an ``update_file`` diff applied: ``invalid_field`` or ``patch_failed`` if not."""
    return apply_chunks(text, parse_update(diff), path)
