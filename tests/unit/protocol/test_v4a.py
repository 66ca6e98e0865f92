"""The V4A diff of OpenAI's apply_patch: parsed and applied to text, many cases ported from codex's
apply-patch crate (parser.rs, lib.rs, seek_sequence.rs and its scenario fixtures)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from corral.errors import ActionError, ErrorCode
from corral.protocol import v4a
from corral.protocol.v4a import Chunk, apply_update, parse_create, parse_update, seek


def _invalid(match: str) -> Any:
    """``pytest.raises`` for a malformed diff: ``invalid_field`` about ``action.diff``."""
    return pytest.raises(ActionError, match=match)


def _assert_code(raised: Any, code: ErrorCode) -> None:
    assert (raised.value.code, raised.value.field) == (code, "action.diff")


# -- parsing --------------------------------------------------------------------------------------------------


def test_a_chunk_with_a_header_context_removed_and_added_lines() -> None:
    chunks = parse_update("@@ def f():\n-    pass\n+    return 123\n")
    assert chunks == [Chunk("def f():", ("    pass",), ("    return 123",), False, 1, (None,))]


def test_the_first_chunk_may_omit_its_header() -> None:
    (chunk,) = parse_update(" import foo\n+bar")
    assert (chunk.header, chunk.old, chunk.new) == (None, ("import foo",), ("import foo", "bar"))


def test_later_chunks_need_an_at_at_header() -> None:
    chunks = parse_update("@@\n foo\n-bar\n+BAR\n@@\n baz\n-qux\n+QUX")
    assert [(c.old, c.new) for c in chunks] == [(("foo", "bar"), ("foo", "BAR")), (("baz", "qux"), ("baz", "QUX"))]


def test_an_empty_line_in_a_chunk_is_an_empty_context_line() -> None:
    (chunk,) = parse_update("@@\n a\n\n-b\n+B")
    assert chunk.old == ("a", "", "b") and chunk.new == ("a", "", "B")


def test_end_of_file_marks_the_chunk() -> None:
    (chunk,) = parse_update("@@\n+quux\n*** End of File\n")
    assert chunk.end_of_file and chunk.new == ("quux",)


def test_a_whole_one_file_patch_envelope_is_accepted() -> None:
    diff = "*** Begin Patch\n*** Update File: a.py\n@@\n-x\n+y\n*** End Patch\n"
    assert parse_update(diff) == parse_update("@@\n-x\n+y")


def test_crlf_diffs_read_as_lf() -> None:
    assert parse_update("@@\r\n-x\r\n+y\r\n") == parse_update("@@\n-x\n+y\n")


@pytest.mark.parametrize(
    ("diff", "wording"),
    [
        ("", "has no changes"),
        ("@@\n", "has no lines"),
        ("@@\n-a\n+b\n@@", "has no lines"),
        ("garbage", "does not start with ' ' (context), '-' (removed) or '+' (added)"),
        ("@@\n-a\nb", "line 3: 'b' does not start"),
        ("@@\n-a\n*** Update File: other.py\n+b", "one file's changes per diff"),
        ("*** Move to: b.py\n@@\n-a", "not supported"),
        ("@@\n-a\n+b\n*** End of File\n x", "expected an @@ header"),
    ],
)
def test_malformed_diffs_are_refused_with_the_line(diff: str, wording: str) -> None:
    with _invalid(re.escape(wording)) as raised:
        parse_update(diff)
    _assert_code(raised, ErrorCode.INVALID_FIELD)


def test_create_takes_the_plus_lines_and_ends_with_a_newline() -> None:
    assert parse_create("+hello\n+world\n") == "hello\nworld\n"
    assert parse_create("+a\n\n+b") == "a\n\nb\n"  # an empty line is an empty line
    assert parse_create("*** Begin Patch\n*** Add File: x\n+hi\n*** End Patch") == "hi\n"


def test_create_refuses_a_line_without_plus() -> None:
    with _invalid(re.escape("invalid diff: line 2 of the diff does not start with '+'")) as raised:
        parse_create("+ok\nnot ok\n")
    _assert_code(raised, ErrorCode.INVALID_FIELD)


# -- finding (codex's seek_sequence) ---------------------------------------------------------------------------


def test_seek_exact_then_trailing_then_both_sides_then_unicode() -> None:
    assert seek(["foo", "bar", "baz"], ("bar", "baz"), 0) == 1
    assert seek(["foo   ", "bar\t\t"], ("foo", "bar"), 0) == 0
    assert seek(["    foo   ", "   bar\t"], ("foo", "bar"), 0) == 0
    assert seek(["a \u2013 b \u201cq\u201d\u00a0x"], ('a - b "q" x',), 0) == 0
    assert seek(["just one line"], ("too", "many", "lines"), 0) is None
    assert seek(["a", "b"], (), 1) == 1


def test_an_exact_match_anywhere_wins_over_a_loose_one_earlier() -> None:
    assert seek(["x  ", "x"], ("x",), 0) == 1


def test_end_of_file_looks_at_the_end_first() -> None:
    assert seek(["a", "b", "a"], ("a",), 0, end_of_file=True) == 2
    assert seek(["a", "b", "c"], ("a",), 0, end_of_file=True) == 0  # falls back to searching from start


# -- applying ------------------------------------------------------------------------------------------------


def test_update_modifies_content() -> None:
    assert apply_update("foo\nbar\n", "@@\n foo\n-bar\n+baz") == "foo\nbaz\n"


def test_multiple_chunks_in_one_file() -> None:
    assert apply_update("foo\nbar\nbaz\nqux\n", "@@\n foo\n-bar\n+BAR\n@@\n baz\n-qux\n+QUX") == "foo\nBAR\nbaz\nQUX\n"


def test_interleaved_changes() -> None:
    diff = "@@\n a\n-b\n+B\n@@\n c\n d\n-e\n+E\n@@\n f\n+g\n*** End of File"
    assert apply_update("a\nb\nc\nd\ne\nf\n", diff) == "a\nB\nc\nd\nE\nf\ng\n"


def test_unicode_dash_matching() -> None:
    original = "import asyncio  # local import \u2013 avoids top\u2011level dep\n"
    diff = "@@\n-import asyncio  # local import - avoids top-level dep\n+import asyncio  # HELLO"
    assert apply_update(original, diff) == "import asyncio  # HELLO\n"


def test_pure_addition_goes_to_the_end_and_chunks_are_applied_in_file_order() -> None:
    diff = "@@\n+after-context\n+second-line\n@@\n line1\n-line2\n-line3\n+line2-replacement"
    assert apply_update("line1\nline2\nline3\n", diff) == "line1\nline2-replacement\nafter-context\nsecond-line\n"


def test_pure_addition_after_a_header_goes_below_it() -> None:
    assert (
        apply_update("class A:\n    x = 1\nend\n", "@@ class A:\n+    y = 2") == "class A:\n    y = 2\n    x = 1\nend\n"
    )


def test_end_of_file_addition() -> None:
    assert apply_update("foo\nbar\nbaz\n", "@@\n+quux\n*** End of File") == "foo\nbar\nbaz\nquux\n"


def test_the_header_narrows_where_lines_are_looked_for() -> None:
    original = "def a():\n    return 1\ndef b():\n    return 1\n"
    assert apply_update(original, "@@ def b():\n-    return 1\n+    return 2") == (
        "def a():\n    return 1\ndef b():\n    return 2\n"
    )


def test_deletion_only() -> None:
    assert apply_update("line1\nline2\nline3\n", "@@\n line1\n-line2\n line3") == "line1\nline3\n"


def test_a_file_without_a_final_newline_gets_one() -> None:
    # codex (the model's own reference) terminates every line an update writes back.
    assert apply_update("no newline at end", "@@\n-no newline at end\n+first line\n+second line") == (
        "first line\nsecond line\n"
    )
    assert apply_update("a\nb", "@@\n a\n-b\n+c") == "a\nc\n"


def test_each_untouched_line_keeps_its_own_end_and_new_lines_take_the_first() -> None:
    # codex's text_file.rs: a mixed file stays mixed; what is written takes the first line's end.
    assert apply_update("a\r\nb\nc\r\n", "@@\n a\n b\n-c\n+C\n+D") == "a\r\nb\nC\r\nD\r\n"
    assert apply_update("a\nb\r\n", "@@\n-a\n+A") == "A\nb\r\n"


def test_an_empty_file_takes_the_diffs_line_ends() -> None:
    assert apply_update("", "@@\r\n+hello\r\n+world") == "hello\r\nworld\r\n"
    assert apply_update("", "@@\n+hello\n+world") == "hello\nworld\n"


def test_a_final_bare_plus_in_a_create_diff_is_the_final_newline() -> None:
    assert parse_create("+hello\n+world\n+") == "hello\nworld\n"
    assert parse_create("+hello\r\n+world\r\n+") == "hello\r\nworld\r\n"
    assert parse_create("+a\n+\n+") == "a\n\n"


def test_a_reused_parent_header_narrows_nothing() -> None:
    source = "class T\n    def first():\n        pass\n\n    def second():\n        pass\n"
    diff = (
        "@@ class T\n@@     def first():\n-        pass\n+        return 1\n"
        "@@ class T\n@@     def second():\n-        pass\n+        return 2"
    )
    assert apply_update(source, diff) == source.replace("pass", "return 1", 1).replace("pass", "return 2")


def test_a_header_never_in_the_file_still_fails() -> None:
    with pytest.raises(ActionError, match="'@@ nope'"):
        apply_update("a\nb\n", "@@ nope\n-b\n+B")


def test_an_empty_file_gets_a_final_newline() -> None:
    assert apply_update("", "+a") == "a\n"


def test_a_trailing_empty_context_line_may_stand_for_the_final_newline() -> None:
    assert apply_update("a\nb\n", "@@\n a\n-b\n+c\n\n") == "a\nc\n"


def test_context_lines_keep_the_files_own_text() -> None:
    assert apply_update("  a \u2013 b\nc\n", "@@\n a - b\n-c\n+d") == "  a \u2013 b\nd\n"


def test_a_context_line_past_a_dropped_final_empty_line_is_the_diffs() -> None:
    assert apply_update("a\n", "@@\n a\n \n+x") == "a\n\nx\n"


def test_crlf_files_keep_their_line_ends() -> None:
    assert apply_update("a\r\nb\r\n", "@@\n a\n-b\n+c") == "a\r\nc\r\n"


def test_trailing_whitespace_in_the_diff_is_forgiven() -> None:
    assert apply_update("x = 1\ny = 2\n", "@@\n x = 1   \n-y = 2  \n+y = 3") == "x = 1\ny = 3\n"


def test_context_not_found_names_the_lines() -> None:
    with pytest.raises(ActionError) as raised:
        apply_update("foo\nbar\n", "@@\n-nonexistent\n+replacement", "/w/missing.txt")
    _assert_code(raised, ErrorCode.PATCH_FAILED)
    assert raised.value.message == "chunk 1 (diff line 1): these lines were not found in /w/missing.txt:\nnonexistent"


def test_a_header_not_found_names_it() -> None:
    with pytest.raises(ActionError, match=re.escape("'@@ nonexistent_context' names was not found in f.py")):
        apply_update("foo\nbar\n", "@@ nonexistent_context\n-bar\n+baz", "f.py")


def test_a_failing_second_chunk_applies_nothing() -> None:
    diff = "@@\n-foo\n+FOO\n@@\n-gone\n+here"
    with pytest.raises(ActionError, match=r"chunk 2 \(diff line 4\).*below line 1:\ngone"):
        apply_update("foo\nbar\n", diff, "f")


def test_chunks_must_come_in_file_order() -> None:
    # The second chunk's lines are above the first one: codex looks below, and so does Corral.
    with pytest.raises(ActionError, match="chunk 2"):
        apply_update("a\nb\nc\n", "@@\n-c\n+C\n@@\n-a\n+A")


def test_end_of_file_context_must_be_at_the_end_before_elsewhere() -> None:
    assert apply_update("x\ny\nx\n", "@@\n-x\n+z\n*** End of File") == "x\ny\nz\n"


def test_module_surface() -> None:
    assert v4a.BEGIN_PATCH == "*** Begin Patch" and v4a.END_OF_FILE == "*** End of File"


# -- the review's findings ------------------------------------------------------------------------------------


def test_stacked_headers_are_found_in_turn() -> None:
    source = "class A:\n    def f(self):\n        return 1\nclass B:\n    def f(self):\n        return 1\n"
    diff = "@@ class B:\n@@     def f(self):\n-        return 1\n+        return 2\n"
    (chunk,) = parse_update(diff)
    assert (chunk.outer, chunk.header) == (("class B:",), "def f(self):")
    assert apply_update(source, diff) == source[: source.rindex("1")] + "2\n"


def test_a_stacked_header_not_found_names_it() -> None:
    with pytest.raises(ActionError) as caught:
        apply_update("class A:\n    x = 1\n", "@@ class B:\n@@     x = 1\n-    x = 1\n+    x = 2\n")
    assert caught.value.code == ErrorCode.PATCH_FAILED
    assert "'@@ class B:'" in caught.value.message


def test_create_keeps_the_diffs_crlf_line_ends() -> None:
    assert parse_create("+a\r\n+b\r\n") == "a\r\nb\r\n"
    assert parse_create("+a\n+b\n") == "a\nb\n"


@pytest.mark.parametrize(
    ("diff", "parse"),
    [
        ("*** Begin Patch\n*** Add File: x\n+hi\n*** End Patch", parse_update),
        ("*** Begin Patch\n*** Delete File: x\n*** End Patch", parse_update),
        ("*** Begin Patch\n*** Update File: x\n@@\n-a\n+b\n*** End Patch", parse_create),
    ],
)
def test_an_envelope_for_another_operation_is_refused(diff: str, parse: Any) -> None:
    with pytest.raises(ActionError) as caught:
        parse(diff)
    assert caught.value.code == ErrorCode.INVALID_FIELD
    assert "does not fit this operation" in caught.value.message


def test_seek_starts_from_the_patterns_rarest_line() -> None:
    # The old seek compared every line of the file against the pattern (95 s on 160 KB); a line of
    # the pattern that is nowhere in the file ends the search with no comparison at all.
    budget = v4a._Budget(100_000)
    assert seek(v4a.Lines(["a"] * 80_000, budget), ("a",) * 2000 + ("b",), 0) is None
    assert budget.left == 100_000 - 4 * (80_000 // 16)  # the four passes built; nothing compared


def test_a_diff_matching_too_many_places_is_refused_within_its_budget() -> None:
    lines = (["b"] + ["a"] * 50) * 200  # every "b" is a candidate that fails 50 lines later
    budget = v4a._Budget(5_000)
    with pytest.raises(ActionError) as caught:
        seek(v4a.Lines(lines, budget), ("b", *("a",) * 51), 0)
    assert caught.value.code == ErrorCode.PATCH_FAILED
    assert "too ambiguous to place" in caught.value.message
    assert budget.left > -100  # it stopped soon after the budget ran out


def test_seek_finds_what_the_exhaustive_search_finds() -> None:
    lines = ["x = 1", "  y = 2  ", "z", "y = 2", "z", "w"]
    assert seek(lines, ("y = 2", "z"), 0) == 3  # exact pass first, across the whole file
    assert seek(lines, ("y = 2", "z"), 4) is None
    assert seek(lines, ("  y = 2", "z"), 0) == 1  # the rstrip pass
    assert seek(lines, ("z", "w"), 0, end_of_file=True) == 4
