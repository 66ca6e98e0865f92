"""apply_patch over the AgentFs seam (a fake of plain os calls): create, update, delete, and every
failure leaving the file as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.sandbox.tools.editor import Editor
from corral.sandbox.tools.files import AgentFiles
from corral.sandbox.tools.patch import Patcher

from ..fakefs import FakeAgentFs


class Box:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.fs = FakeAgentFs()
        self.patcher = Patcher(Editor(AgentFiles(self.fs, workspace=str(root)), self.fs), self.fs)

    async def patch(self, operation: str, path: str, diff: str | None = None) -> dict[str, Any]:
        action = a.ApplyPatch(type="apply_patch", operation=operation, path=path, diff=diff)  # type: ignore[arg-type]
        return (await self.patcher.run(action)).wire()

    async def fails(self, operation: str, path: str, diff: str | None = None) -> ActionError:
        with pytest.raises(ActionError) as raised:
            await self.patch(operation, path, diff)
        return raised.value


@pytest.fixture()
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


async def test_create_update_delete(box: Box) -> None:
    file = box.root / "pkg" / "mod.py"
    path = str(file)
    assert await box.patch("create_file", path, "+def f():\n+    pass\n") == {"output": f"Created {path}", "path": path}
    assert file.read_text() == "def f():\n    pass\n"
    updated = await box.patch("update_file", path, "@@ def f():\n-    pass\n+    return 1\n")
    assert updated["output"] == f"Updated {path}"
    assert file.read_text() == "def f():\n    return 1\n"
    assert (await box.patch("delete_file", path))["output"] == f"Deleted {path}"
    assert not file.exists()


async def test_a_relative_path_is_in_the_workspace(box: Box) -> None:
    workspace = Patcher(Editor(AgentFiles(box.fs), box.fs), box.fs)
    action = a.ApplyPatch(type="apply_patch", operation="delete_file", path="gone.txt")
    with pytest.raises(ActionError) as raised:
        await workspace.run(action)
    assert raised.value.code == ErrorCode.NO_SUCH_FILE and "/workspace/gone.txt" in raised.value.message


async def test_context_gone_is_patch_failed_and_changes_nothing(box: Box) -> None:
    target = box.root / "f.txt"
    target.write_text("alpha\nbeta\ngamma\n")
    error = await box.fails("update_file", str(target), "@@\n-alpha\n+ALPHA\n@@\n-delta\n+DELTA\n")
    assert (error.code, error.field) == (ErrorCode.PATCH_FAILED, "action.diff")
    assert error.message.endswith(f"these lines were not found in {target} below line 1:\ndelta")
    assert target.read_text() == "alpha\nbeta\ngamma\n"
    assert [p.name for p in box.root.iterdir()] == ["f.txt"]  # no temporary file left


async def test_malformed_diff_is_an_invalid_field(box: Box) -> None:
    (box.root / "f.txt").write_text("a\n")
    error = await box.fails("update_file", f"{box.root}/f.txt", "@@\n-a\nnonsense\n")
    assert (error.code, error.field) == (ErrorCode.INVALID_FIELD, "action.diff")
    assert error.message.startswith("invalid diff: line 3")


async def test_create_on_an_existing_file_replaces_it_and_update_of_a_missing_one_fails(box: Box) -> None:
    # codex's *** Add File: (scenario 011_add_overwrites_existing_file) and agents-python both overwrite.
    (box.root / "f.txt").write_text("old\n")
    created = await box.patch("create_file", f"{box.root}/f.txt", "+new\n")
    assert created["output"] == f"Created {box.root}/f.txt (it replaced the file that was there)"
    assert (box.root / "f.txt").read_text() == "new\n"
    (box.root / "dir").mkdir()
    assert (await box.fails("create_file", f"{box.root}/dir", "+x\n")).code == ErrorCode.IS_A_DIRECTORY
    missing = await box.fails("update_file", f"{box.root}/nope.txt", "@@\n-a\n+b\n")
    assert missing.code == ErrorCode.NO_SUCH_FILE
    assert (await box.fails("delete_file", f"{box.root}/nope.txt")).code == ErrorCode.NO_SUCH_FILE
    (box.root / "d").mkdir()
    assert (await box.fails("delete_file", f"{box.root}/d")).code == ErrorCode.IS_A_DIRECTORY


async def test_a_file_the_agent_may_not_write_is_refused_and_unchanged(box: Box) -> None:
    target = box.root / "f.txt"
    target.write_text("a\n")
    box.fs.denied.add(str(box.root))  # the directory: no temporary file can be made in it
    error = await box.fails("update_file", str(target), "@@\n-a\n+b\n")
    assert (error.code, error.field) == (ErrorCode.PERMISSION_DENIED, "action.path")
    assert target.read_text() == "a\n"


@pytest.mark.parametrize("operation", ["update_file", "create_file"])
async def test_a_read_only_file_is_refused_as_the_agent_would_be(box: Box, operation: str) -> None:
    target = box.root / "ro.txt"
    target.write_text("a\n")
    box.fs.read_only.add(str(target))
    diff = "@@\n-a\n+b\n" if operation == "update_file" else "+b\n"
    error = await box.fails(operation, str(target), diff)
    assert (error.code, error.field) == (ErrorCode.PERMISSION_DENIED, "action.path")
    assert error.message == (
        f"{target}: Permission denied: the agent may not write this file (its mode, or its owner), "
        "so the editor does not either"
    )
    assert target.read_text() == "a\n" and [p.name for p in box.root.iterdir()] == ["ro.txt"]


async def test_a_read_only_directory_is_named_in_the_error(box: Box) -> None:
    target = box.root / "f.txt"
    target.write_text("a\n")
    box.fs.denied.add(str(box.root))
    error = await box.fails("update_file", str(target), "@@\n-a\n+b\n")
    assert error.code == ErrorCode.PERMISSION_DENIED
    assert f"the agent may not create files in {box.root}, where the new text is written" in error.message
