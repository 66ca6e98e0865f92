"""MIME bundles and errors as run_code's results: only E2B's types, the too large named in
``omitted`` with ``text/plain`` kept, ANSI colours gone, every part bounded."""

from __future__ import annotations

import json

from corral.sandbox.kernels import bundle


def test_known_types_are_kept_as_text_and_others_named() -> None:
    data = {
        "text/plain": "p",
        "text/html": ["<b>", "x</b>"],  # Jupyter may split text into lines
        "application/json": {"a": [1, None]},
        "image/png": "iVBORw0KGgo=",
        "application/vnd.plotly.v1+json": {"data": []},
    }
    out, used = bundle.output(data, main=True, budget=1 << 20)
    assert out.data == {
        "text/plain": "p",
        "text/html": "<b>x</b>",
        "application/json": '{"a": [1, null]}',
        "image/png": "iVBORw0KGgo=",
    }
    assert out.omitted == ["application/vnd.plotly.v1+json"] and out.is_main_result is True
    assert used == sum(len(json.dumps(text)) for text in out.data.values())


def test_a_value_of_the_wrong_shape_is_omitted() -> None:
    out, _ = bundle.output(
        {"text/plain": "p", "image/png": {"not": "base64"}, "text/html": [1, 2]}, main=False, budget=999
    )
    assert out.data == {"text/plain": "p"} and sorted(out.omitted) == ["image/png", "text/html"]


def test_an_image_past_the_budget_is_dropped_and_its_text_kept() -> None:
    out, used = bundle.output({"image/png": "A" * 5000, "text/plain": "<Figure>"}, main=False, budget=1000)
    assert out.data == {"text/plain": "<Figure>"} and out.omitted == ["image/png"]
    assert used <= 1000


def test_text_plain_is_cut_to_the_room_left_as_json() -> None:
    out, used = bundle.output({"text/plain": "é" * 10_000}, main=True, budget=500)
    text = out.data["text/plain"]
    assert text.endswith(bundle.CUT) and 300 <= len(json.dumps(text)) <= 500
    assert used == len(json.dumps(text))


def test_text_plain_is_kept_when_the_budget_is_spent() -> None:
    out, used = bundle.output({"text/plain": "x" * 10_000, "text/html": "<p>"}, main=True, budget=0)
    assert out.data["text/plain"].endswith(bundle.CUT) and out.omitted == ["text/html"]
    assert used <= bundle.TEXT_RESERVE


def test_a_bundle_that_is_not_an_object_is_empty() -> None:
    out, used = bundle.output(["text/plain"], main=True, budget=100)
    assert (out.data, out.omitted, used) == ({}, [], 0)


def test_omitted_names_are_bounded() -> None:
    data = {f"application/x-{i}" + "y" * 500: "v" for i in range(100)}
    out, _ = bundle.output(data, main=False, budget=100)
    assert len(out.omitted) == bundle.MAX_OMITTED and all(len(name) <= bundle.MAX_MIME_NAME for name in out.omitted)


def test_ansi_sequences_are_stripped() -> None:
    coloured = "\x1b[0;31mZeroDivisionError\x1b[0m: \x1b]8;;http://x\x07link\x1b]8;;\x07 \x1b[1A\x1bM"
    assert bundle.strip_ansi(coloured) == "ZeroDivisionError: link "


def test_an_error_is_read_bounded_and_without_colours() -> None:
    error = bundle.error(
        {"ename": "ValueError", "evalue": "\x1b[31mbad\x1b[0m", "traceback": ["\x1b[0;31mline 1\x1b[0m", 7, "line 2"]}
    )
    assert (error.name, error.value, error.traceback) == ("ValueError", "bad", "line 1\nline 2")
    huge = bundle.error({"ename": "E" * 10_000, "evalue": "v" * (1 << 20), "traceback": ["t" * (1 << 20)]})
    assert len(huge.name.encode()) <= bundle.MAX_ERROR_NAME and len(huge.value.encode()) <= bundle.MAX_ERROR_VALUE
    assert len(huge.traceback.encode()) <= bundle.MAX_TRACEBACK


def test_an_error_of_the_wrong_shape_still_reads() -> None:
    error = bundle.error({"ename": 3, "evalue": None, "traceback": "not a list"})
    assert (error.name, error.value, error.traceback) == ("Error", "", "")


def test_cut_never_splits_a_character() -> None:
    assert bundle.cut("ab", 10) == "ab"
    cut = bundle.cut("€" * 100, 50)
    assert cut.endswith(bundle.CUT) and len(cut.encode()) <= 50
    cut.encode().decode()  # still valid UTF-8
