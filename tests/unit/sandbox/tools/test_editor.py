"""The editor: its text work against the reference editor's outputs and wording (pure), its undo
history's bounds, and the Editor over the AgentFs seam (a fake of plain os calls)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.sandbox.tools import editor
from corral.sandbox.tools.editor import Editor, UndoHistory, UndoLimits, insert, numbered, replace, view_text
from corral.sandbox.tools.files import AgentFiles

from ..fakefs import FakeAgentFs

TEXT = "".join(f"line {n}\n" for n in range(1, 11))  # 10 lines and a final newline: 11 "lines" to the reference


def _error(fn: Any, *args: Any) -> ActionError:
    with pytest.raises(ActionError) as raised:
        fn(*args)
    return raised.value


# -- view ---------------------------------------------------------------------------------------------------


def test_numbered_is_cat_n_with_the_reference_header() -> None:
    assert numbered("a\nb", "/w/f") == "Here's the result of running `cat -n` on /w/f:\n     1\ta\n     2\tb\n"


def test_view_range_and_minus_one() -> None:
    assert (
        view_text(TEXT, "/f", (2, 3), 100)
        == "Here's the result of running `cat -n` on /f:\n     2\tline 2\n     3\tline 3\n"
    )
    tail = view_text(TEXT, "/f", (10, -1), 100)
    assert tail.endswith("    10\tline 10\n    11\t\n")


@pytest.mark.parametrize(
    ("view_range", "message"),
    [
        (
            (0, 3),
            "Invalid `view_range`: [0, 3]. Its first element `0` should be within the range of lines of the file: "
            "[1, 11]",
        ),
        (
            (1, 12),
            "Invalid `view_range`: [1, 12]. Its second element `12` should be smaller than the number of lines in "
            "the file: `11`",
        ),
        ((5, 3), "Invalid `view_range`: [5, 3]. Its second element `3` should be larger or equal than its first `5`"),
    ],
)
def test_view_range_errors_have_the_reference_wording(view_range: tuple[int, int], message: str) -> None:
    error = _error(view_text, TEXT, "/f", view_range, 100)
    assert (error.code, error.message, error.field) == (ErrorCode.INVALID_FIELD, message, "action.view_range")


def test_a_long_view_is_cut_with_the_reference_note() -> None:
    out = view_text("x" * 50, "/f", None, 10)
    assert out == f"Here's the result of running `cat -n` on /f:\n     1\t{'x' * 10}{editor.TRUNCATED_MESSAGE}\n"


def test_tabs_are_shown_as_they_are() -> None:
    assert numbered("\tindented", "/f").endswith("     1\t\tindented\n")


# -- str_replace -----------------------------------------------------------------------------------------------


def test_replace_one_and_the_snippet() -> None:
    new, message = replace(TEXT, "/f", "line 7\n", "seven\nSEVEN\n")
    assert new == TEXT.replace("line 7\n", "seven\nSEVEN\n")
    snippet = "".join(f"{n:6}\t{text}\n" for n, text in zip(range(3, 14), [*new.split("\n")[2:12]], strict=False))
    assert message == (
        "The file /f has been edited. Here's the result of running `cat -n` on a snippet of /f:\n"
        + snippet
        + "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )


def test_no_match_has_the_reference_wording() -> None:
    error = _error(replace, TEXT, "/w/f.py", "absent", "x")
    assert (error.code, error.field) == (ErrorCode.NO_MATCH, "action.old_str")
    assert error.message == "No replacement was performed, old_str `absent` did not appear verbatim in /w/f.py."


def test_multiple_matches_name_the_lines_where_each_starts() -> None:
    error = _error(replace, "a = 1\nb = 1\nc = 2\nd = 1\n", "/f", "= 1", "= 3")
    assert error.code == ErrorCode.MULTIPLE_MATCHES
    assert error.message == (
        "No replacement was performed. Multiple occurrences of old_str `= 1` in lines [1, 2, 4]. "
        "Please ensure it is unique"
    )
    multi = _error(replace, "x\ny\nx\ny\n", "/f", "x\ny", "z")
    assert "in lines [1, 3]" in multi.message  # the reference lists [] for a multi-line old_str


def test_replace_all_replaces_every_occurrence() -> None:
    new, message = replace("a = 1\nb = 1\n", "/f", "= 1", "= 2", replace_all=True)
    assert new == "a = 2\nb = 2\n"
    assert message.startswith("The file /f has been edited: 2 occurrences of old_str were replaced. ")
    assert _error(replace, "x", "/f", "", "y", True).code == ErrorCode.INVALID_FIELD


def test_tabs_are_kept_when_replacing() -> None:
    new, _ = replace("all:\n\tcc -o x x.c\n", "/Makefile", "-o x", "-o y")
    assert new == "all:\n\tcc -o y x.c\n"  # the reference would write "        cc -o y x.c"


def test_an_empty_old_str_fills_an_empty_file() -> None:
    assert replace("", "/f", "", "hello")[0] == "hello"
    assert _error(replace, "a\nb", "/f", "", "x").code == ErrorCode.MULTIPLE_MATCHES


# -- insert ------------------------------------------------------------------------------------------------------


def test_insert_after_a_line_and_the_snippet() -> None:
    new, message = insert("a\nb\nc", "/f", 1, "X")
    assert new == "a\nX\nb\nc"
    assert message == (
        "The file /f has been edited. Here's the result of running `cat -n` on a snippet of the edited file:\n"
        "     1\ta\n     2\tX\n     3\tb\n     4\tc\n"
        "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). "
        "Edit the file again if necessary."
    )
    assert insert("a", "/f", 0, "top")[0] == "top\na"


def test_insert_line_out_of_range_has_the_reference_wording() -> None:
    error = _error(insert, "a\nb", "/f", 3, "x")
    assert (error.code, error.field) == (ErrorCode.INVALID_FIELD, "action.insert_line")
    assert (
        error.message
        == "Invalid `insert_line` parameter: 3. It should be within the range of lines of the file: [0, 2]"
    )


# -- the undo history --------------------------------------------------------------------------------------------


def test_undo_history_is_per_path_newest_first() -> None:
    history = UndoHistory()
    history.push("/a", "a1")
    history.push("/b", "b1")
    history.push("/a", "a2")
    assert (history.pop("/a"), history.pop("/a"), history.pop("/a")) == ("a2", "a1", None)
    assert history.pop("/b") == "b1" and len(history) == 0


def test_undo_history_is_bounded_per_path_in_entries_and_in_bytes() -> None:
    history = UndoHistory(UndoLimits(per_path=2, entries=3, bytes=10))
    for text in ("1", "2", "3"):
        history.push("/a", text)
    assert len(history) == 2  # the oldest of /a went
    history.push("/b", "b")
    history.push("/c", "c")
    assert len(history) == 3 and history.pop("/a") == "3" and history.pop("/a") is None  # "2" went: oldest overall
    history.push("/big", "x" * 9)
    assert history.pop("/b") is None and history.pop("/big") == "x" * 9  # bytes over 10: oldest went


def test_undo_history_counts_what_the_texts_weigh_in_memory() -> None:
    # One astral character makes a str 4 bytes per character; the history holds UTF-8 and counts that.
    history = UndoHistory(UndoLimits(bytes=1_000))
    text = "a" * 900 + "\U0001f600"
    history.push("/a", text)
    assert history.held_bytes == 904
    history.push("/b", text)  # 1,808 bytes: the oldest goes
    assert history.pop("/a") is None and history.pop("/b") == text and history.held_bytes == 0


# -- the Editor over the agent's files ---------------------------------------------------------------------------


class Box:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.fs = FakeAgentFs()
        self.editor = Editor(AgentFiles(self.fs, workspace=str(root)), self.fs)

    async def edit(self, **fields: Any) -> dict[str, Any]:
        return (await self.editor.run(a.Edit(type="edit", **fields))).wire()

    async def fails(self, **fields: Any) -> ActionError:
        with pytest.raises(ActionError) as raised:
            await self.edit(**fields)
        return raised.value


@pytest.fixture()
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


async def test_create_view_replace_insert_undo(box: Box) -> None:
    file = box.root / "sub" / "new.txt"
    path = str(file)
    created = await box.edit(command="create", path=path, file_text="one\ntwo\n")
    assert created == {"output": f"File created successfully at: {path}", "path": path}
    assert file.read_text() == "one\ntwo\n"
    assert (await box.edit(command="view", path=path))["output"].endswith("     1\tone\n     2\ttwo\n     3\t\n")
    await box.edit(command="str_replace", path=path, old_str="two", new_str="2")
    await box.edit(command="insert", path=path, insert_line=0, new_str="zero")
    assert file.read_text() == "zero\none\n2\n"
    undone = await box.edit(command="undo_edit", path=path)
    assert undone["output"].startswith(
        f"Last edit to {path} undone successfully. Here's the result of running `cat -n`"
    )
    assert file.read_text() == "one\n2\n"
    await box.edit(command="undo_edit", path=path)
    assert file.read_text() == "one\ntwo\n"
    await box.edit(command="undo_edit", path=path)  # the create's entry: the text it created (as the reference)
    error = await box.fails(command="undo_edit", path=path)
    assert (error.code, error.message) == (ErrorCode.NOTHING_TO_UNDO, f"No edit history found for {path}.")


async def test_path_errors_have_the_reference_wording(box: Box) -> None:
    (box.root / "f.txt").write_text("x\n")
    relative = await box.fails(command="view", path="f.txt")
    assert (relative.code, relative.message) == (
        ErrorCode.INVALID_FIELD,
        "The path f.txt is not an absolute path, it should start with `/`. Maybe you meant /workspace/f.txt?",
    )
    missing = await box.fails(command="view", path=f"{box.root}/nope")
    assert (missing.code, missing.message) == (
        ErrorCode.NO_SUCH_FILE,
        f"The path {box.root}/nope does not exist. Please provide a valid path.",
    )
    exists = await box.fails(command="create", path=f"{box.root}/f.txt", file_text="y")
    assert (exists.code, exists.message) == (
        ErrorCode.FILE_EXISTS,
        f"File already exists at: {box.root}/f.txt. Cannot overwrite files using command `create`.",
    )
    directory = await box.fails(command="str_replace", path=str(box.root), old_str="a")
    assert directory.code == ErrorCode.IS_A_DIRECTORY
    assert directory.message.endswith("is a directory and only the `view` command can be used on directories")
    needed = await box.fails(command="create", path=f"{box.root}/g.txt")
    assert (needed.code, needed.message, needed.field) == (
        ErrorCode.MISSING_FIELD,
        "Parameter `file_text` is required for command: create",
        "action.file_text",
    )
    assert (box.root / "f.txt").read_text() == "x\n"


async def test_a_directory_is_listed_two_levels_deep_without_hidden_entries(box: Box) -> None:
    for name in ("a/b/c/deep.txt", "a/top.txt", ".hidden/x.txt", "a/.secret", "z.txt"):
        (box.root / name).parent.mkdir(parents=True, exist_ok=True)
        (box.root / name).write_text("")
    out = (await box.edit(command="view", path=str(box.root)))["output"]
    root = str(box.root)
    assert out == (
        f"Here's the files and directories up to 2 levels deep in {root}, excluding hidden items:\n"
        f"{root}\n{root}/a\n{root}/a/b\n{root}/a/top.txt\n{root}/z.txt\n\n"
    )
    with_range = await box.fails(command="view", path=root, view_range=(1, 2))
    assert with_range.message == "The `view_range` parameter is not allowed when `path` points to a directory."


async def test_binary_and_oversized_files_are_refused(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    (box.root / "blob").write_bytes(b"\xff\xfe\x00")
    binary = await box.fails(command="view", path=f"{box.root}/blob")
    assert binary.code == ErrorCode.INVALID_REQUEST and "is not UTF-8 text" in binary.message
    assert (await box.fails(command="str_replace", path=f"{box.root}/blob", old_str="x")).code == binary.code
    monkeypatch.setattr(editor, "MAX_EDIT_BYTES", 4)
    (box.root / "big").write_text("12345")
    big = await box.fails(command="view", path=f"{box.root}/big")
    assert big.code == ErrorCode.TOO_LARGE and "at most 4 bytes" in big.message


async def test_an_edit_through_a_symlink_changes_its_target_and_keeps_the_link(box: Box) -> None:
    (box.root / "real.txt").write_text("old\n")
    os.chmod(box.root / "real.txt", 0o600)
    os.symlink("real.txt", box.root / "link.txt")
    await box.edit(command="str_replace", path=f"{box.root}/link.txt", old_str="old", new_str="new")
    assert (box.root / "link.txt").is_symlink() and (box.root / "real.txt").read_text() == "new\n"
    assert (box.root / "real.txt").stat().st_mode & 0o777 == 0o600  # the mode is kept


async def test_a_path_the_agent_may_not_touch_is_permission_denied(box: Box) -> None:
    (box.root / "f.txt").write_text("x\n")
    box.fs.denied.add(f"{box.root}/f.txt")
    error = await box.fails(command="view", path=f"{box.root}/f.txt")
    assert (error.code, error.field) == (ErrorCode.PERMISSION_DENIED, "action.path")


@pytest.mark.parametrize(
    "fields",
    [
        {"command": "str_replace", "old_str": "x", "new_str": "y"},
        {"command": "insert", "insert_line": 1, "new_str": "y"},
    ],
)
async def test_a_read_only_file_is_refused_and_kept(box: Box, fields: dict[str, Any]) -> None:
    # Through a symlink too: the file checked is the one that would be replaced.
    (box.root / "f.txt").write_text("x\n")
    os.symlink("f.txt", box.root / "link.txt")
    box.fs.read_only.add(f"{box.root}/f.txt")
    for name in ("f.txt", "link.txt"):
        error = await box.fails(path=f"{box.root}/{name}", **fields)
        assert (error.code, error.field) == (ErrorCode.PERMISSION_DENIED, "action.path")
        assert error.message.startswith(f"{box.root}/{name}: Permission denied: the agent may not write this file")
    assert (box.root / "f.txt").read_text() == "x\n" and len(box.editor.history) == 0


async def test_max_characters_cuts_the_view(box: Box) -> None:
    (box.root / "long.txt").write_text("y" * 100)
    out = (await box.edit(command="view", path=f"{box.root}/long.txt", max_characters=20))["output"]
    assert "y" * 20 + editor.TRUNCATED_MESSAGE in out and "y" * 21 not in out


async def test_concurrent_edits_of_one_file_both_land(box: Box) -> None:
    target = box.root / "f.txt"
    target.write_text("a\nb\n")
    path = str(target)
    await asyncio.gather(
        box.edit(command="str_replace", path=path, old_str="a", new_str="A"),
        box.edit(command="str_replace", path=path, old_str="b", new_str="B"),
    )
    assert target.read_text() == "A\nB\n"


# -- the review's findings: bounded messages and views, CRLF, races ------------------------------------------


def test_multiple_matches_finds_each_line_in_one_pass_and_lists_at_most_a_hundred() -> None:
    content = "x\n" * 80_000
    error = _error(replace, content, "/f", "x", "y")
    assert error.code == ErrorCode.MULTIPLE_MATCHES
    listed = ", ".join(str(n) for n in range(1, 101))
    assert f"in lines [{listed}, ... and 79900 more]. Please ensure it is unique" in error.message
    assert len(error.message) < 1_000
    assert editor._lines_of("a\nb\nc\na", [0, 2, 6]) == [1, 2, 4]


def test_an_empty_old_str_on_a_long_file_names_a_bounded_list() -> None:
    error = _error(replace, "\n" * 2_000_000, "/f", "", "y")
    assert error.code == ErrorCode.MULTIPLE_MATCHES
    assert "... and 1999901 more]" in error.message
    assert len(error.message) < 1_000


def test_a_long_old_str_is_echoed_cut() -> None:
    old = "q" * 50_000
    error = _error(replace, "text\n", "/f", old, "y")
    assert error.code == ErrorCode.NO_MATCH
    assert f"`{'q' * editor.MAX_ECHOED_CHARS}... (50000 characters)`" in error.message
    assert len(error.message) < 2_000


def test_the_numbered_view_is_cut_too() -> None:
    # 16M empty lines cut to max_characters were numbered whole: ~8 characters per line shown.
    shown = view_text("\n" * (1 << 24), "/f", None, 1 << 24)
    assert len(shown) <= editor.MAX_NUMBERED_CHARS + len(editor.TRUNCATED_MESSAGE) + 200
    assert shown.rstrip("\n").endswith(editor.TRUNCATED_MESSAGE)
    assert view_text(TEXT, "/f", None, 1 << 24) == view_text(TEXT, "/f", None, 16_000)  # small files: as before


async def test_a_view_asking_for_more_than_fits_gets_the_cap(box: Box) -> None:
    file = box.root / "big.txt"
    file.write_text("y" * (editor.MAX_VIEW_CHARS + 10))
    shown = (await box.edit(command="view", path=str(file), max_characters=1 << 24))["output"]
    assert "y" * editor.MAX_VIEW_CHARS + editor.TRUNCATED_MESSAGE in shown
    assert "y" * (editor.MAX_VIEW_CHARS + 1) not in shown


async def test_a_crlf_file_is_viewed_matched_and_edited_as_lf_and_keeps_crlf(box: Box) -> None:
    file = box.root / "dos.txt"
    file.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    path = str(file)
    assert "\r" not in (await box.edit(command="view", path=path))["output"]
    await box.edit(command="str_replace", path=path, old_str="one\ntwo", new_str="1\n2")
    assert file.read_bytes() == b"1\r\n2\r\nthree\r\n"
    await box.edit(command="insert", path=path, insert_line=1, new_str="1.5")
    assert file.read_bytes() == b"1\r\n1.5\r\n2\r\nthree\r\n"
    await box.edit(command="undo_edit", path=path)
    assert file.read_bytes() == b"1\r\n2\r\nthree\r\n"


def test_line_ends_are_written_back_as_the_file_had_them() -> None:
    assert editor.with_line_ends_of("a\r\nb\r\n", "a\nc\n") == "a\r\nc\r\n"
    assert editor.with_line_ends_of("a\r\nb\n", "a\nc\n") == "a\nc\n"  # mixed: as it is
    assert editor.with_line_ends_of("a\nb\n", "a\nc\n") == "a\nc\n"


async def test_create_does_not_replace_a_file_made_after_the_check(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    file = box.root / "raced.txt"
    mkstemp = box.fs.mkstemp

    async def racing(directory: str, prefix: str) -> tuple[int, str]:
        file.write_text("theirs")  # another writer, between the existence check and the rename
        return await mkstemp(directory, prefix)

    monkeypatch.setattr(box.fs, "mkstemp", racing)
    error = await box.fails(command="create", path=str(file), file_text="mine")
    assert (error.code, error.message) == (
        ErrorCode.FILE_EXISTS,
        f"File already exists at: {file}. Cannot overwrite files using command `create`.",
    )
    assert file.read_text() == "theirs"
    assert len(box.editor.history) == 0


async def test_an_undo_whose_write_fails_keeps_its_entry(box: Box) -> None:
    file = box.root / "u.txt"
    path = str(file)
    await box.edit(command="create", path=path, file_text="a\n")
    await box.edit(command="str_replace", path=path, old_str="a", new_str="b")
    box.fs.full = True
    error = await box.fails(command="undo_edit", path=path)
    assert error.code != ErrorCode.NOTHING_TO_UNDO
    assert len(box.editor.history) == 2  # the create's entry and the replace's, neither lost
    box.fs.full = False
    await box.edit(command="undo_edit", path=path)
    assert file.read_text() == "a\n"


async def test_a_directory_view_lists_at_most_max_listed_entries_in_all(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(editor, "MAX_LISTED", 5)
    for name in ("a", "b", "c"):
        for sub in ("1", "2", "3"):
            (box.root / "tree" / name / sub).mkdir(parents=True)
    shown = (await box.edit(command="view", path=str(box.root / "tree")))["output"]
    assert len([line for line in shown.splitlines() if line.startswith(str(box.root / "tree") + "/")]) == 5
