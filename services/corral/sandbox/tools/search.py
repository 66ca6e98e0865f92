"""The ``file_glob`` and ``file_grep`` actions: finding files and lines, as the agent.

``file_glob`` walks the tree under ``path`` through the launcher (entries ``lstat``-ed, so a symlink
is matched as itself and never followed out of the tree), matches each path relative to ``path``
against a doublestar pattern (:class:`Glob`, no backtracking regex) and gives the newest first. ``file_grep`` runs
ripgrep as the agent through the process table (an argv, never a shell string) and reads its
``--json`` lines; both are bounded.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.agent.processes import ProcessTable, RunContext
from corral.sandbox.tools.files import MAX_SCANNED, AgentFiles, file_error

GREP_TIMEOUT_MS = 60_000
GREP_OUTPUT_BYTES = 8 << 20  # ripgrep's JSON lines read; past it the result is truncated
MAX_LINE_CHARS = 2_000  # of one matching line's text
RG = "/usr/bin/rg"  # the image's ripgrep (Debian's package), never whatever "rg" the agent's PATH finds first


# -- glob (pure) ------------------------------------------------------------------------------------------------


MAX_GLOB_EXPANSIONS = 256  # patterns one ``{a,b}`` pattern may expand to
_DOUBLESTAR = "**"


def _glob_error(pattern: str, why: str) -> ActionError:
    return ActionError(ErrorCode.INVALID_FIELD, f"{why} in the pattern {pattern!r}", "action.pattern")


def _closing_brace(pattern: str, start: int) -> int:
    depth = 0
    for index in range(start, len(pattern)):
        if pattern[index] == "{":
            depth += 1
        elif pattern[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _alternatives(body: str) -> list[str]:
    """``a,{b,c},d`` split on its top-level commas."""
    out, depth, last = [], 0, 0
    for index, char in enumerate(body):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            out.append(body[last:index])
            last = index + 1
    return [*out, body[last:]]


def expand_braces(pattern: str, limit: int = MAX_GLOB_EXPANSIONS) -> list[str]:
    """``{x,y}`` expanded up front (nested too), at most ``limit`` patterns: each is then matched
    without alternation, so no match can backtrack through the alternatives."""
    done: list[str] = []
    todo = [pattern]
    while todo:
        current = todo.pop()
        opening = current.find("{")
        if opening == -1:
            done.append(current)
            continue
        closing = _closing_brace(current, opening)
        if closing == -1:
            raise _glob_error(pattern, "unclosed '{'")
        head, tail = current[:opening], current[closing + 1 :]
        todo.extend(head + choice + tail for choice in reversed(_alternatives(current[opening + 1 : closing])))
        if len(done) + len(todo) > limit:
            raise _glob_error(pattern, f"more than {limit} alternatives")
    return done


# One segment's tokens: a literal character, "?" (any one), "*" (any run), or a class (negated, ranges).
Token = str | tuple[bool, tuple[tuple[str, str], ...]]


def _segment_tokens(segment: str) -> list[Token]:
    tokens: list[Token] = []
    index = 0
    while index < len(segment):
        char = segment[index]
        end = segment.find("]", index + 2) if char == "[" else -1
        if char == "*":
            if not (tokens and tokens[-1] == "*"):  # ** inside a name is one *
                tokens.append("*")
        elif char == "?":
            tokens.append("?")
        elif end != -1:
            body = segment[index + 1 : end]
            negated = body[:1] in ("!", "^")
            body = body[1:] if negated else body
            ranges: list[tuple[str, str]] = []
            at = 0
            while at < len(body):
                if at + 2 < len(body) and body[at + 1] == "-":
                    ranges.append((body[at], body[at + 2]))
                    at += 3
                else:
                    ranges.append((body[at], body[at]))
                    at += 1
            tokens.append((negated, tuple(ranges)))
            index = end
        else:
            tokens.append("\\" + char)  # a literal, marked so it is never read as ? or *
        index += 1
    return tokens


def _one(token: Token, char: str) -> bool:
    if token == "?":
        return True
    if isinstance(token, tuple):
        negated, ranges = token
        return any(low <= char <= high for low, high in ranges) is not negated
    return token[1] == char


class Glob:
    """A doublestar pattern matched without a backtracking regex: ``{x,y}`` expanded up front
    (:func:`expand_braces`), the path split on '/', a ``**`` segment spanning any number of
    directories (``a/**/b`` matches ``a/b`` too; a final ``**`` at least one name) by a set of
    states over the segments, and each name matched by the classic greedy wildcard walk with one
    backtrack point (``*`` and ``?`` stay within a name, ``[...]`` is a class, ``[!...]`` its
    complement). Work per path is at most expansions x segments x name length x pattern length.
    ``steps`` counts the character comparisons made, so tests can bound the work."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._alternatives = [
            [None if part == _DOUBLESTAR else _segment_tokens(part) for part in expanded.split("/")]
            for expanded in expand_braces(pattern)
        ]
        self.steps = 0

    def match(self, path: str) -> bool:
        names = path.split("/")
        return any(self._path(segments, names) for segments in self._alternatives)

    def _path(self, segments: list[list[Token] | None], names: list[str]) -> bool:
        last = len(segments)

        def closure(states: set[int]) -> set[int]:
            out = set(states)
            for state in sorted(states):
                while state < last - 1 and segments[state] is None:  # a ** before more segments: zero of them
                    state += 1
                    out.add(state)
            return out

        states = closure({0})
        for name in names:
            following: set[int] = set()
            for state in states:
                if state == last:
                    continue
                tokens = segments[state]
                if tokens is None:
                    following |= {state, state + 1}
                elif self._name(tokens, name):
                    following.add(state + 1)
            states = closure(following)
            if not states:
                return False
        return last in states

    def _name(self, tokens: list[Token], name: str) -> bool:
        """One name against one segment: greedy, backtracking only to the last ``*`` (linear per try)."""
        t = n = 0
        star_t, star_n = -1, 0
        while n < len(name):
            self.steps += 1
            if t < len(tokens) and tokens[t] != "*" and _one(tokens[t], name[n]):
                t, n = t + 1, n + 1
            elif t < len(tokens) and tokens[t] == "*":
                star_t, star_n = t, n
                t += 1
            elif star_t != -1:
                star_n += 1
                t, n = star_t + 1, star_n
            else:
                return False
        while t < len(tokens) and tokens[t] == "*":
            t += 1
        return t == len(tokens)


def glob_matcher(pattern: str) -> Glob:
    """The matcher of a ``file_glob`` pattern (``invalid_field`` when it cannot be one)."""
    return Glob(pattern)


# -- grep's output (pure) -----------------------------------------------------------------------------------------


def _text(field: object) -> str | None:
    """ripgrep's ``{"text": ...}`` or, for bytes that are not UTF-8, ``{"bytes": base64}``; None
    for anything else."""
    if not isinstance(field, dict):
        return None
    if isinstance(field.get("text"), str):
        return str(field["text"])
    try:
        return base64.b64decode(str(field["bytes"]), validate=True).decode(errors="replace")
    except (KeyError, ValueError):
        return None


def _match(data: object) -> r.GrepMatch | None:
    """One ``match`` record's ``data`` as a match; None when it lacks the shape ripgrep gives it (the
    agent controls the binary's inputs, so a record is read, never trusted)."""
    if not isinstance(data, dict):
        return None
    path, text, line = _text(data.get("path")), _text(data.get("lines")), data.get("line_number")
    if path is None or text is None or not isinstance(line, int) or isinstance(line, bool):
        return None
    text = text.rstrip("\r\n")
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + "…"
    return r.GrepMatch(path=path, line=line, text=text)


def grep_matches(stdout: str, limit: int) -> tuple[list[r.GrepMatch], bool]:
    """The ``match`` records of ripgrep's ``--json`` output (a cut last line is skipped), at most
    ``limit``; True when there were more."""
    matches: list[r.GrepMatch] = []
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("type") != "match":
            continue
        match = _match(record.get("data"))
        if match is None:
            continue
        if len(matches) >= limit:
            return matches, True
        matches.append(match)
    return matches, False


def grep_argv(action: a.FileGrep, root: str) -> list[str]:
    argv = [RG, "--json", "--no-config", "--no-messages", "--regexp", action.pattern]
    if action.ignore_case:
        argv.append("--ignore-case")
    if action.glob is not None:
        argv += ["--glob", action.glob]
    return [*argv, "--", root]


# -- the actions -------------------------------------------------------------------------------------------------


class Search:
    """``file_glob`` over the agent's files and ``file_grep`` through the agent's processes."""

    def __init__(self, files: AgentFiles, processes: ProcessTable) -> None:
        self._files = files
        self._processes = processes

    async def run(self, action: a.FileGlob | a.FileGrep, context: RunContext) -> r.GlobMatches | r.GrepMatches:
        root = self._files.resolve(action.path)
        try:
            if isinstance(action, a.FileGlob):
                return await self._glob(action, root)
            await self._reachable(root)
            return await self._grep(action, root, context)
        except OSError as exc:
            raise file_error(exc, "action.path") from None

    async def _reachable(self, root: str) -> None:
        """``root`` absent or out of the agent's reach is said plainly (ripgrep, told not to print its
        messages, would find nothing): a directory must be listable, a file readable."""
        if (await self._files.stat(root)).type == "directory":
            await self._files.listing(root, False, None, 1)
        else:
            os.close(await self._files.open_regular(root))

    async def _glob(self, action: a.FileGlob, root: str) -> r.GlobMatches:
        matcher = glob_matcher(action.pattern)
        absolute = action.pattern.startswith("/")
        found, truncated = await self._files.listing(root, True, None, MAX_SCANNED)
        hits = [item for item in found if matcher.match(item.path if absolute else posixpath.relpath(item.path, root))]
        hits.sort(key=lambda item: (-item.mtime, item.path))
        return r.GlobMatches(
            paths=[item.path for item in hits[: action.limit]], truncated=truncated or len(hits) > action.limit
        )

    async def _grep(self, action: a.FileGrep, root: str, context: RunContext) -> r.GrepMatches:
        exec_action = a.Exec(
            type="exec",
            argv=grep_argv(action, root),
            cwd="/",
            timeout_ms=GREP_TIMEOUT_MS,
            max_output_bytes=GREP_OUTPUT_BYTES,
        )
        result = (await self._processes.exec(exec_action, context)).root
        assert isinstance(result, r.ExecFinished)  # a foreground exec's
        if result.exit_code == 2:
            _refuse(action, result.stderr)
        matches, more = grep_matches(result.stdout, action.limit)
        truncated = more or result.stdout_truncated or result.timed_out
        return r.GrepMatches(matches=matches, truncated=truncated)


def _refuse(action: a.FileGrep, stderr: str) -> None:
    """ripgrep's own refusals (exit 2): a pattern or glob it cannot parse is the caller's field;
    other errors (an unreadable file among many) leave what matched."""
    message = stderr.strip()
    if "regex parse error" in message or "error parsing regex" in message.lower():
        raise ActionError(ErrorCode.INVALID_FIELD, message, "action.pattern")
    if "glob" in message.lower() and action.glob is not None:
        raise ActionError(ErrorCode.INVALID_FIELD, message, "action.glob")
