"""Replaying a recording against a fresh sandbox, step by step, and judging each step's screen.

Each recorded request is sent again verbatim (its dialect and all), the screen is let settle, and
the frame is compared with the recorded one: both are masked, blurred a little and compared pixel
by pixel; the step diverges when more than ``threshold`` of the pixels differ visibly (or when the
request fails where it succeeded, or the other way round). Per-step overrides can change the
threshold, add masks or skip a step.
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from PIL import Image, ImageChops, ImageFilter

from corral.recording.bundle import Bundle

PIXEL_DELTA = 40  # a grey-level difference (0-255) a person would notice after the blur
FRAME_REQUEST = {
    "action": {"type": "wait", "ms": 0},
    "wait_for": "stable",
    "screenshot": {"format": "webp", "width": 640, "quality": 60},
}


@dataclass(frozen=True, slots=True)
class Mask:
    """A region to ignore, in the recorded frame's pixels: x, y, width, height."""

    x: int
    y: int
    width: int
    height: int

    @classmethod
    def parse(cls, text: str) -> Mask:
        parts = text.split(",")
        if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"a mask is x,y,width,height in whole pixels, not {text!r}")
        x, y, w, h = (int(p) for p in parts)
        if w == 0 or h == 0:
            raise ValueError(f"a mask needs a width and a height: {text!r}")
        return cls(x, y, w, h)


@dataclass(frozen=True, slots=True)
class StepOverride:
    threshold: float | None = None
    masks: tuple[Mask, ...] = ()
    skip: bool = False


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    threshold: float = 0.01
    masks: tuple[Mask, ...] = ()
    overrides: Mapping[int, StepOverride] = field(default_factory=dict)  # by step number, from 1
    recorded_timing: bool = False


@dataclass(frozen=True, slots=True)
class Comparison:
    score: float  # the share of pixels that differ visibly
    diff_png: bytes


@dataclass(frozen=True, slots=True)
class StepResult:
    number: int
    summary: str
    recorded_ok: bool
    replayed_ok: bool
    threshold: float
    score: float | None
    passed: bool
    reason: str
    recorded_frame: bytes | None = field(repr=False, default=None)
    replayed_frame: bytes | None = field(repr=False, default=None)
    diff_png: bytes | None = field(repr=False, default=None)
    elapsed_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class ReplayReport:
    source: str
    steps: list[StepResult]

    @property
    def passed(self) -> bool:
        return all(step.passed for step in self.steps)

    @property
    def divergences(self) -> list[StepResult]:
        return [step for step in self.steps if not step.passed]


def parse_overrides(text: str) -> dict[int, StepOverride]:
    """``{"3": {"threshold": 0.05, "masks": ["0,0,100,20"], "skip": false}, ...}``; raises ValueError."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"overrides are not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("overrides must be a JSON object keyed by step number")
    out: dict[int, StepOverride] = {}
    for key, value in raw.items():
        if not str(key).isdigit() or int(key) < 1 or not isinstance(value, dict):
            raise ValueError(f"override {key!r}: keys are step numbers from 1, values objects")
        unknown = set(value) - {"threshold", "masks", "skip"}
        if unknown:
            raise ValueError(f"override {key}: unknown field(s) {sorted(unknown)}")
        threshold = value.get("threshold")
        if threshold is not None and not (isinstance(threshold, int | float) and 0 <= threshold <= 1):
            raise ValueError(f"override {key}: threshold must be between 0 and 1")
        masks = value.get("masks", [])
        if not isinstance(masks, list):
            raise ValueError(f"override {key}: masks must be a list of 'x,y,width,height'")
        out[int(key)] = StepOverride(
            float(threshold) if threshold is not None else None,
            tuple(Mask.parse(str(m)) for m in masks),
            bool(value.get("skip", False)),
        )
    return out


def _prepared(data: bytes, size: tuple[int, int], masks: tuple[Mask, ...]) -> Image.Image:
    image = Image.open(io.BytesIO(data)).convert("L")
    if image.size != size:
        image = image.resize(size)
    for mask in masks:
        image.paste(0, (mask.x, mask.y, mask.x + mask.width, mask.y + mask.height))
    return image.filter(ImageFilter.BoxBlur(1))


def compare(recorded: bytes, replayed: bytes, masks: tuple[Mask, ...] = ()) -> Comparison:
    """The share of visibly different pixels, and a picture of where (red on the recorded frame)."""
    base = Image.open(io.BytesIO(recorded)).convert("RGB")
    a = _prepared(recorded, base.size, masks)
    b = _prepared(replayed, base.size, masks)
    delta = ImageChops.difference(a, b).point(lambda v: 255 if v > PIXEL_DELTA else 0)
    changed = delta.histogram()[255]
    score = changed / (base.width * base.height)
    overlay = Image.blend(base, Image.new("RGB", base.size, (255, 255, 255)), 0.6)
    overlay.paste((230, 0, 0), mask=delta)
    out = io.BytesIO()
    overlay.save(out, "PNG")
    return Comparison(score, out.getvalue())


def summarize(event: Mapping[str, Any]) -> str:
    native = event.get("native") or []
    if native:
        first = native[0]
        details = {k: v for k, v in first.items() if k != "type" and not isinstance(v, dict | list)}
        text = " ".join(f"{k}={v}" for k, v in list(details.items())[:3])
        more = f" (+{len(native) - 1})" if len(native) > 1 else ""
        return f"{first.get('type')} {text}".strip()[:120] + more
    return f"{event.get('dialect') or 'request'} (not read)"


Send = Callable[[dict[str, Any]], dict[str, Any]]


def replay(
    bundle: Bundle, send: Send, options: ReplayOptions, log: Callable[[str], None] = lambda _: None
) -> ReplayReport:
    """Send each recorded request through ``send`` (one sandbox's protocol), judge each step."""
    steps: list[StepResult] = []
    actions = bundle.actions
    start_wall, first_recorded = time.monotonic(), (actions[0].get("started") if actions else None)
    for number, event in enumerate(actions, start=1):
        override = options.overrides.get(number, StepOverride())
        threshold = override.threshold if override.threshold is not None else options.threshold
        summary = summarize(event)
        recorded_ok = bool(event.get("ok"))
        if override.skip:
            steps.append(StepResult(number, summary, recorded_ok, recorded_ok, threshold, None, True, "skipped"))
            continue
        if options.recorded_timing and first_recorded is not None and event.get("started"):
            wait = (float(event["started"]) - float(first_recorded)) - (time.monotonic() - start_wall)
            if wait > 0:
                time.sleep(wait)
        request = event.get("request")
        began = time.perf_counter()
        # An unreadable message is sent again to be refused again.
        reply = send(request) if isinstance(request, dict) else send({"raw": request})
        elapsed = (time.perf_counter() - began) * 1000
        replayed_ok = bool(reply.get("ok"))
        shot = send(FRAME_REQUEST)
        replayed = base64.b64decode(shot["screenshot"]["data"]) if shot.get("ok") and shot.get("screenshot") else None
        recorded = bundle.frame(event)
        masks = options.masks + override.masks
        score: float | None = None
        diff = None
        if replayed_ok != recorded_ok:
            passed, reason = False, f"the request {'failed' if recorded_ok else 'succeeded'} this time"
        elif recorded is None or replayed is None:
            passed, reason = True, "no frame to compare"
        else:
            comparison = compare(recorded, replayed, masks)
            score, diff = comparison.score, comparison.diff_png
            passed = score <= threshold
            reason = f"{score:.2%} of the screen differs (threshold {threshold:.2%})"
        log(f"step {number} {'ok ' if passed else 'DIVERGED'} {summary}: {reason}")
        steps.append(
            StepResult(number, summary, recorded_ok, replayed_ok, threshold, score, passed, reason,
                       recorded, replayed, diff, elapsed)
        )
    return ReplayReport(bundle.source, steps)


def _xml_text(text: str) -> str:
    """Text XML 1.0 can hold (typed text may carry control characters)."""
    return "".join(c if _xml_char(c) else "?" for c in text)


def _xml_char(c: str) -> bool:
    return c in "\t\n\r" or " " <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd"


def junit_xml(report: ReplayReport, name: str = "corral replay") -> bytes:
    suite = ET.Element(
        "testsuite",
        name=name,
        tests=str(len(report.steps)),
        failures=str(len(report.divergences)),
        skipped=str(sum(1 for s in report.steps if s.reason == "skipped")),
    )
    for step in report.steps:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=_xml_text(report.source),
            name=_xml_text(f"step {step.number}: {step.summary}"),
            time=f"{step.elapsed_ms / 1000:.3f}",
        )
        if step.reason == "skipped":
            ET.SubElement(case, "skipped")
        elif not step.passed:
            ET.SubElement(case, "failure", message=_xml_text(step.reason)).text = _xml_text(step.reason)
    return bytes(ET.tostring(suite, encoding="utf-8", xml_declaration=True))


def _img(data: bytes | None, mime: str, alt: str) -> str:
    if data is None:
        return f"<div class=none>{html.escape(alt)}: none</div>"
    return f"<img alt='{html.escape(alt)}' src='data:{mime};base64,{base64.b64encode(data).decode()}'>"


def html_report(report: ReplayReport) -> str:
    """One self-contained page: each step with the recorded, replayed and difference images."""
    rows = []
    for step in report.steps:
        state = "pass" if step.passed else "fail"
        rows.append(
            f"<section class='step {state}' id='step-{step.number}'>"
            f"<h2>Step {step.number}: {html.escape(step.summary)} "
            f"<span class=verdict>{'passed' if step.passed else 'DIVERGED'}</span></h2>"
            f"<p class=reason>{html.escape(step.reason)}</p><div class=frames>"
            f"<figure>{_img(step.recorded_frame, 'image/webp', 'recorded')}<figcaption>recorded</figcaption></figure>"
            f"<figure>{_img(step.replayed_frame, 'image/webp', 'replayed')}<figcaption>replayed</figcaption></figure>"
            f"<figure>{_img(step.diff_png, 'image/png', 'difference')}<figcaption>difference</figcaption></figure>"
            "</div></section>"
        )
    verdict = "passed" if report.passed else f"{len(report.divergences)} step(s) diverged"
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>Corral replay: {html.escape(verdict)}</title><style>"
        "body{font:14px sans-serif;margin:1em}.frames{display:flex;gap:8px}figure{margin:0}"
        "img{width:400px;border:1px solid #ccc}.fail h2{color:#b00}.pass h2{color:#070}"
        "</style></head><body>"
        f"<h1 id=summary>Replay of {html.escape(report.source)}: {html.escape(verdict)}</h1>"
        + "".join(rows)
        + "</body></html>"
    )
