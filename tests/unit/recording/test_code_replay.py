"""``run_code`` steps in a recording and on replay: redaction (the code kept to its prefix, the logs
joined, every output to the budget with its size and sha256), and the judge (the error, each result's
text with memory addresses aside, each image by how far it differs to the eye, with real PNGs made by
Pillow; logs when asked), through replay()'s ``send`` seam."""

from __future__ import annotations

import base64
import hashlib
import io
from typing import Any

from PIL import Image, ImageDraw

from corral.recording.codejudge import IMAGE_THRESHOLD, code_checks, normalised
from corral.recording.imagediff import similarity
from corral.recording.judge import judged_by_result
from corral.recording.redact import CODE_PREFIX_BYTES, redact
from corral.recording.replay import ReplayOptions, parse_overrides, replay

from .test_replay import Commands, bundle, command


def chart(height: int, color: tuple[int, int, int] = (30, 90, 200), size: tuple[int, int] = (120, 80)) -> str:
    """A bar chart as matplotlib might draw it: a white canvas, axes, one bar of ``height`` pixels."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    draw.line([(10, 5), (10, size[1] - 10), (size[0] - 5, size[1] - 10)], fill="black", width=1)
    draw.rectangle([30, size[1] - 10 - height, 60, size[1] - 11], fill=color)
    out = io.BytesIO()
    image.save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def run(code: str = "plot()") -> dict[str, Any]:
    return {"type": "run_code", "code": code, "language": "python", "context": "default"}


def ran(
    *outputs: dict[str, Any], stdout: list[str] | None = None, error: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "context": "default",
        "language": "python",
        "results": list(outputs),
        "logs": {"stdout": stdout or [], "stderr": [], "truncated": False},
        "error": error,
        "execution_count": 1,
        "timed_out": False,
        "state_lost": False,
        "duration_ms": 5.0,
    }


def output(is_main: bool = True, **data: str) -> dict[str, Any]:
    mimes = {"text": "text/plain", "html": "text/html", "png": "image/png", "svg": "image/svg+xml"}
    return {"data": {mimes[name]: value for name, value in data.items()}, "is_main_result": is_main}


def recorded(act: dict[str, Any], result: dict[str, Any], budget: int = 48 << 10) -> dict[str, Any]:
    event = {"seq": 1, "event": "action", "request": {"id": "1", "action": act}, "native": [act], "ok": True}
    return redact({**event, "reply": {"ok": True, "id": "1", "result": result}, "frame": None}, output_budget=budget)


# -- redaction ---------------------------------------------------------------------------------------------


def test_a_cell_is_kept_whole_its_logs_joined_and_every_output_has_a_digest() -> None:
    png = chart(40)
    event = recorded(run("x = 1\nx"), ran(output(text="1", png=png), stdout=["a", "b\n"]))
    assert event["request"]["action"]["code"] == "x = 1\nx" and event["native"][0]["code"] == "x = 1\nx"
    result = event["reply"]["result"]
    assert result["logs"]["stdout"] == ["ab\n"]  # one chunk: what was printed, not how it was split
    payloads = event["payloads"]
    assert payloads["reply.result.logs.stdout"] == {
        "size": 3,
        "sha256": hashlib.sha256(b"ab\n").hexdigest(),
        "truncated": False,
    }
    image = payloads["reply.result.results.0.data.image/png"]
    assert image["size"] == len(base64.b64decode(png)) and not image["truncated"]
    assert result["results"][0]["data"]["image/png"] == png
    assert redact(event) == event  # a second pass (the gateway's) changes nothing


def test_a_long_cell_and_outputs_past_the_budget_are_cut_with_their_digests() -> None:
    code = "# " + "x" * (CODE_PREFIX_BYTES + 100)
    traceback = "Traceback\n" + "  frame\n" * 2000
    event = recorded(run(code), ran(error={"name": "E", "value": "v", "traceback": traceback}), budget=1024)
    assert len(event["request"]["action"]["code"]) == CODE_PREFIX_BYTES
    assert event["payloads"]["request.action.code"]["truncated"] is True
    assert event["payloads"]["reply.result.error.traceback"]["size"] == len(traceback)
    assert len(event["reply"]["result"]["error"]["traceback"]) <= 1024
    # A cell kept only in part is not run again: replay skips it and says why.
    report = replay(bundle([{**event, "seq": 1}], {}), Commands([]), ReplayOptions())
    assert report.steps[0].status == "skipped" and "kept only the start of its code" in report.steps[0].reason


# -- the judge ---------------------------------------------------------------------------------------------


def test_image_similarity_with_real_pngs() -> None:
    same, taller = base64.b64decode(chart(40)), base64.b64decode(chart(60))
    assert similarity(same, same) == 0.0
    assert similarity(same, base64.b64decode(chart(41))) <= IMAGE_THRESHOLD  # one row of pixels
    assert similarity(same, taller) > IMAGE_THRESHOLD
    # A replayed image of another size (a higher dpi) is scaled to the recorded one's, then compared.
    out = io.BytesIO()
    Image.open(io.BytesIO(same)).resize((240, 160), Image.Resampling.NEAREST).save(out, "PNG")
    assert similarity(same, out.getvalue()) <= IMAGE_THRESHOLD


def test_a_redrawn_chart_and_an_address_in_the_text_pass() -> None:
    text = "[<matplotlib.lines.Line2D at 0x7f3a5c2b1d90>]"
    event = recorded(run(), ran(output(False, png=chart(40)), output(text=text)))
    again = {"ok": True, "result": ran(output(False, png=chart(41)), output(text=text.replace("3a5c", "99aa")))}
    checks = code_checks(event, again, {})
    assert all(passed for *_, passed in checks), checks
    assert [name for name, *_ in checks] == ["error", "results", "result 1 image/png", "result 2 text/plain"]
    assert normalised(text) == "[<matplotlib.lines.Line2D at 0x…>]"


def test_another_chart_another_value_another_error_each_diverge() -> None:
    event = recorded(run(), ran(output(False, png=chart(40)), output(text="42", html="<b>42</b>")))
    other = {"ok": True, "result": ran(output(False, png=chart(70)), output(text="43", html="<b>42</b>"))}
    failed = {name: (theirs, mine) for name, theirs, mine, passed in code_checks(event, other, {}) if not passed}
    assert set(failed) == {"result 1 image/png", "result 2 text/plain"}
    assert failed["result 2 text/plain"] == ("'42'", "'43'")
    raised = {"ok": True, "result": ran(error={"name": "KeyError", "value": "'a'", "traceback": "tb"})}
    failed = {name: (theirs, mine) for name, theirs, mine, passed in code_checks(event, raised, {}) if not passed}
    assert failed == {"error": ("none", "KeyError"), "results": ("2", "0")}


def test_an_image_the_recording_cut_is_compared_by_its_sha256() -> None:
    png = chart(40)
    event = recorded(run(), ran(output(False, png=png)), budget=64)
    assert event["payloads"]["reply.result.results.0.data.image/png"]["truncated"] is True
    same = code_checks(event, {"result": ran(output(False, png=png))}, {})
    redrawn = code_checks(event, {"result": ran(output(False, png=chart(41)))}, {})
    assert same[-1][0] == "result 1 image/png" and same[-1][3] is True
    assert redrawn[-1][3] is False and "sha256" in redrawn[-1][1]


def test_an_image_that_is_not_one_is_a_clear_divergence() -> None:
    event = recorded(run(), ran(output(False, png=chart(40))))
    name, _, replayed, passed = code_checks(event, {"result": ran(output(False, png="bm90IGEgcG5n"))}, {})[-1]
    assert name == "result 1 image/png" and not passed and replayed.startswith("not comparable")


def test_logs_are_compared_when_the_step_asks() -> None:
    event = recorded(run(), ran(stdout=["rows: 3\n"]))
    printed = {"result": ran(stdout=["rows: ", "4\n"])}
    assert all(passed for *_, passed in code_checks(event, printed, {}))  # not asked: not compared
    (name, _, _, passed) = code_checks(event, printed, {"stdout": "exact"})[-1]
    assert name == "stdout" and not passed
    assert code_checks(event, {"result": ran(stdout=["rows: ", "3\n"])}, {"stdout": "exact"})[-1][3]


def test_a_recorded_run_code_replays_through_the_sandbox_seam() -> None:
    assert judged_by_result({"native": [run()]}) and judged_by_result({"native": [{"type": "list_code_contexts"}]})
    steps = [
        command(1, run("import pandas as pd"), ran()),
        command(2, run("df.plot()"), ran(output(False, png=chart(40)), output(text="<Axes>"))),
        command(3, run("df.a.sum()"), ran(output(text="6"))),
    ]
    recording = bundle(steps, {})
    sandbox = Commands([ran(), ran(output(False, png=chart(40)), output(text="<Axes>")), ran(output(text="7"))])
    report = replay(recording, sandbox, ReplayOptions())
    assert [s.status for s in report.steps] == ["passed", "passed", "diverged"]
    assert [s["action"]["code"] for s in sandbox.sent] == ["import pandas as pd", "df.plot()", "df.a.sum()"]
    assert report.steps[2].reason == "result 1 text/plain differs: '7', recorded '6'"
    assert report.steps[1].judged_on == "result" and report.steps[1].summary.startswith("run_code")
    assert "code=" not in report.steps[1].summary  # the code is a payload, not a summary
    options = ReplayOptions(overrides=parse_overrides('{"3": {"skip": true}}'))
    sandbox = Commands([ran(), ran(output(False, png=chart(40)), output(text="<Axes>"))])
    assert replay(recording, sandbox, options).passed
