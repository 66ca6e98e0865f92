"""The ``apply_patch`` action: one file operation of OpenAI's ``apply_patch`` tool, as the agent.

``create_file`` writes a file (its parents are made; one already there is replaced, as codex's
``*** Add File:`` does), ``update_file`` applies a V4A diff (:mod:`corral.protocol.v4a`, pure) to a
file that must exist, ``delete_file`` removes one. An operation touches its own ``path`` only (what
a caller approved): codex's ``*** Move to:`` is refused. All or nothing: the diff is applied in memory
first, and the new text is written to a temporary file renamed over the old one, so a diff whose
context is gone changes nothing. Every step is the agent's: a file the agent may not write (read-only,
another uid's) is refused as its own ``echo >>`` would be (:meth:`AgentFiles.write`).
"""

from __future__ import annotations

import posixpath

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.protocol import v4a
from corral.sandbox.tools.agentfs import AgentFs
from corral.sandbox.tools.editor import Editor
from corral.sandbox.tools.files import WORKSPACE, file_error, in_thread, lexists


class Patcher:
    """``apply_patch`` over the agent's files, reading and writing as :class:`Editor` does (the same
    size cap, UTF-8 only, symlinks followed to their targets)."""

    def __init__(self, editor: Editor, fs: AgentFs) -> None:
        self._editor = editor
        self._fs = fs

    async def run(self, action: a.ApplyPatch) -> r.ToolOutput:
        # Relative: under the workspace. ``..`` stays as given: the agent's uid is the boundary.
        path = action.path if posixpath.isabs(action.path) else posixpath.join(WORKSPACE, action.path)
        try:
            async with self._editor.lock:
                output = await self._operation(action, path)
        except OSError as exc:
            raise file_error(exc, "action.path") from None
        return r.ToolOutput(output=output, path=path)

    async def _operation(self, action: a.ApplyPatch, path: str) -> str:
        match action.operation:
            case "create_file":
                text = v4a.parse_create(action.diff or "")
                replaced = await lexists(self._fs, path)  # a directory there fails the write (is_a_directory)
                await self._editor.write(path, text, make_dirs=True)
                return f"Created {path}" + (" (it replaced the file that was there)" if replaced else "")
            case "update_file":
                chunks = v4a.parse_update(action.diff or "")
                if not await lexists(self._fs, path):
                    raise ActionError(
                        ErrorCode.NO_SUCH_FILE, f"{path} does not exist; create it with create_file", "action.path"
                    )
                text = await self._editor.read(path)
                # Off the event loop: bounded (v4a.MAX_COMPARISONS), but up to a second on a big file.
                newline = v4a.newline_of(action.diff or "")
                await self._editor.write(path, await in_thread(v4a.apply_chunks, text, chunks, path, newline))
                return f"Updated {path}"
            case "delete_file":
                found = await self._fs.stat(path, follow_symlinks=False)
                if found.type == "directory":
                    raise ActionError(
                        ErrorCode.IS_A_DIRECTORY, f"{path} is a directory; delete_file removes files", "action.path"
                    )
                await self._fs.unlink(path)
                return f"Deleted {path}"
