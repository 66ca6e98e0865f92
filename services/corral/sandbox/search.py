"""The ``file_glob`` and ``file_grep`` actions: finding files and lines, as the agent.

``file_glob`` walks the tree under ``path`` through the launcher (entries ``lstat``-ed, so a symlink
is matched as itself and never followed out of the tree), matches each path relative to ``path``
against a doublestar pattern (:func:`glob_regex`) and gives the newest first. ``file_grep`` runs
ripgrep as the agent through the process table (an argv, never a shell string) and reads its
``--json`` lines; both are bounded.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re
from typing import Any

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.sandbox.files import MAX_SCANNED, AgentFiles, file_error
from corral.sandbox.processes import ProcessTable, RunContext

GREP_TIMEOUT_MS = 60_000
GREP_OUTPUT_BYTES = 8 << 20  # ripgrep's JSON lines read; past it the result is truncated
MAX_LINE_CHARS = 2_000  # of one matching line's text


# -- glob (pure) ------------------------------------------------------------------------------------------------


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A doublestar pattern as a regex over '/'-separated paths: ``**`` spans directories (``a/**/b``
    matches ``a/b`` too), ``*`` and ``?`` stay within one name, ``[...]`` is a class, ``{x,y}`` either."""
    out: list[str] = []
    index = 0
    depth = 0  # inside {...}
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
            continue
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", index + 2)
            if end == -1:
                out.append(re.escape(char))
            else:
                body = pattern[index + 1 : end]
                body = "^" + body[1:] if body.startswith("!") else body
                out.append("[" + body.replace("\\", "\\\\") + "]")
                index = end
        elif char == "{":
            out.append("(?:")
            depth += 1
        elif char == "}" and depth:
            out.append(")")
            depth -= 1
        elif char == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(char))
        index += 1
    if depth:
        raise ActionError(ErrorCode.INVALID_FIELD, f"unclosed '{{' in the pattern {pattern!r}", "action.pattern")
    try:
        return re.compile("".join(out) + r"\Z", re.DOTALL)
    except re.error as exc:
        raise ActionError(ErrorCode.INVALID_FIELD, f"invalid pattern {pattern!r}: {exc}", "action.pattern") from None


# -- grep's output (pure) -----------------------------------------------------------------------------------------


def _text(field: dict[str, Any]) -> str:
    """ripgrep's ``{"text": ...}`` or, for bytes that are not UTF-8, ``{"bytes": base64}``."""
    if "text" in field:
        return str(field["text"])
    return base64.b64decode(field.get("bytes", "")).decode(errors="replace")


def grep_matches(stdout: str, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The ``match`` records of ripgrep's ``--json`` output (a cut last line is skipped), at most
    ``limit``; True when there were more."""
    matches: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("type") != "match":
            continue
        if len(matches) >= limit:
            return matches, True
        data = record["data"]
        text = _text(data["lines"]).rstrip("\r\n")
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + "…"
        matches.append({"path": _text(data["path"]), "line": data["line_number"], "text": text})
    return matches, False


def grep_argv(action: a.FileGrep, root: str) -> list[str]:
    argv = ["rg", "--json", "--no-config", "--no-messages", "--regexp", action.pattern]
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

    async def run(self, action: a.FileGlob | a.FileGrep, context: RunContext) -> dict[str, Any]:
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

    async def _glob(self, action: a.FileGlob, root: str) -> dict[str, Any]:
        matcher = glob_regex(action.pattern)
        absolute = action.pattern.startswith("/")
        found, truncated = await self._files.listing(root, True, None, MAX_SCANNED)
        hits = [item for item in found if matcher.match(item.path if absolute else posixpath.relpath(item.path, root))]
        hits.sort(key=lambda item: (-item.mtime, item.path))
        return {
            "paths": [item.path for item in hits[: action.limit]],
            "truncated": truncated or len(hits) > action.limit,
        }

    async def _grep(self, action: a.FileGrep, root: str, context: RunContext) -> dict[str, Any]:
        exec_action = a.Exec(
            type="exec",
            argv=grep_argv(action, root),
            cwd="/",
            timeout_ms=GREP_TIMEOUT_MS,
            max_output_bytes=GREP_OUTPUT_BYTES,
        )
        result = await self._processes.run(exec_action, context)
        if result.get("exit_code") == 2:
            _refuse(action, str(result.get("stderr", "")))
        matches, more = grep_matches(str(result.get("stdout", "")), action.limit)
        truncated = more or bool(result.get("stdout_truncated")) or bool(result.get("timed_out"))
        return {"matches": matches, "truncated": truncated}


def _refuse(action: a.FileGrep, stderr: str) -> None:
    """ripgrep's own refusals (exit 2): a pattern or glob it cannot parse is the caller's field;
    other errors (an unreadable file among many) leave what matched."""
    message = stderr.strip()
    if "regex parse error" in message or "error parsing regex" in message.lower():
        raise ActionError(ErrorCode.INVALID_FIELD, message, "action.pattern")
    if "glob" in message.lower() and action.glob is not None:
        raise ActionError(ErrorCode.INVALID_FIELD, message, "action.glob")
