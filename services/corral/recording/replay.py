"""Replaying a recording against a fresh sandbox, step by step, and judging each step's screen.

Each recorded request is sent again verbatim (its dialect and all), the screen is let settle, and
the frame is compared with the recorded one: both are masked, blurred a little and compared pixel
by pixel; the step diverges when more than ``threshold`` of the pixels differ visibly (or when the
request fails where it succeeded, or the other way round). Per-step overrides can change the
threshold, add masks or skip a step. A step with no frame to compare is skipped (and says why),
never counted as a pass; a recording that lost events (``gap``, ``controller_restarted``) replays
with a warning in every report. Commands and file operations are judged by their result instead
(exit codes, sha256, pids mapped: corral.recording.judge).
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import shlex
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.protocol.actions import LEASE_TYPES
from corral.recording.bundle import Bundle, RecordedEvent
from corral.recording.imagediff import Mask as Mask  # `corral replay --mask` reads it here
from corral.recording.imagediff import compare
from corral.recording.judge import (
    EXPECTATIONS,
    STREAMS,
    Check,
    PidMap,
    cut_upload,
    judge,
    judged_by_result,
    without_hidden,
)
from corral.recording.judge import summary_fields as _summary_fields
from corral.recording.order import in_start_order, overlaps
from corral.recording.redact import redacted_length
from corral.recording.transfers import is_transfer, replay_transfer

FIND_PID_S, FIND_PID_POLL_S = 10.0, 0.05  # how long to look for the pid of an exec sent without waiting
FRAME_REQUEST = {
    "action": {"type": "wait", "ms": 0},
    "wait_for": "stable",
    "screenshot": {"format": "webp", "width": 640, "quality": 60},
}


@dataclass(frozen=True, slots=True)
class StepOverride:
    threshold: float | None = None
    masks: tuple[Mask, ...] = ()
    skip: bool = False
    expect: Mapping[str, str] = field(default_factory=dict)  # "stdout"/"stderr" -> "exact" | "ignore"


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    threshold: float = 0.01
    masks: tuple[Mask, ...] = ()
    overrides: Mapping[int, StepOverride] = field(default_factory=dict)  # by step number, from 1
    recorded_timing: bool = False
    expect: Mapping[str, str] = field(default_factory=dict)  # for every exec step; a step's own wins


StepStatus = Literal["passed", "diverged", "skipped"]
JudgedOn = Literal["screen", "result"]  # a frame against the recorded one, or a command or file step's result


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """One recorded step replayed and judged: passed, diverged or skipped, and why."""

    number: int
    summary: str
    recorded_ok: bool
    replayed_ok: bool
    threshold: float
    score: float | None
    status: StepStatus
    reason: str
    recorded_frame: bytes | None = field(repr=False, default=None)
    replayed_frame: bytes | None = field(repr=False, default=None)
    diff_png: bytes | None = field(repr=False, default=None)
    elapsed_ms: float = 0.0
    checks: tuple[Check, ...] = ()  # a command or file step: what its result was compared on
    judged_on: JudgedOn = "screen"

    @property
    def passed(self) -> bool:
        """Not a divergence (a skipped step is not one)."""
        return self.status != "diverged"


@dataclass(frozen=True, slots=True)
class ReplayReport:
    source: str
    steps: list[StepVerdict]
    warnings: list[str] = field(default_factory=list)  # what the recording lost

    @property
    def passed(self) -> bool:
        return all(step.passed for step in self.steps)

    @property
    def skipped(self) -> list[StepVerdict]:
        return [step for step in self.steps if step.status == "skipped"]

    @property
    def divergences(self) -> list[StepVerdict]:
        return [step for step in self.steps if not step.passed]


def parse_expect(value: Any, where: str) -> dict[str, str]:
    """``{"stdout": "exact", "stderr": "ignore"}``: which outputs of an exec must match; raises ValueError."""
    if not isinstance(value, dict) or not all(k in STREAMS and v in EXPECTATIONS for k, v in value.items()):
        raise ValueError(f"{where}: expect maps stdout/stderr to one of {', '.join(EXPECTATIONS)}")
    return {str(k): str(v) for k, v in value.items()}


def parse_overrides(text: str) -> dict[int, StepOverride]:
    """``{"3": {"threshold": 0.05, "masks": ["0,0,100,20"], "skip": false, "expect": {"stdout": "exact"}}}``;
    raises ValueError."""
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
        unknown = set(value) - {"threshold", "masks", "skip", "expect"}
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
            parse_expect(value.get("expect", {}), f"override {key}"),
        )
    return out


def summarize(event: Mapping[str, Any]) -> str:
    native = event.get("native") or []
    if native:
        first = native[0]
        more = f" (+{len(native) - 1})" if len(native) > 1 else ""
        if first.get("type") == "exec":  # what was run, whichever form it came in
            argv = first.get("argv")
            shown = first.get("command") if argv is None else shlex.join(str(arg) for arg in argv)
            return f"exec {shown}"[:120] + more
        left_out = {"type", *_summary_fields(first.get("type"))}
        details = {k: v for k, v in first.items() if k not in left_out and not isinstance(v, dict | list)}
        text = " ".join(f"{k}={v}" for k, v in list(details.items())[:3])
        return f"{first.get('type')} {text}".strip()[:120] + more
    return f"{event.get('dialect') or 'request'} (not read)"


Send = Callable[[dict[str, Any]], dict[str, Any]]  # a request sent as JSON, its reply: any action's
_LOG_WORD = {"passed": "ok ", "diverged": "DIVERGED", "skipped": "skipped"}


def recording_warnings(bundle: Bundle) -> list[str]:
    """What the recording lost: events the controller dropped, or a controller that restarted."""
    warnings = []
    for event in bundle.events:
        if event.get("event") == "gap":
            warnings.append(f"the recording lost {event.get('lost', '?')} event(s) before event {event['seq']}")
        elif event.get("event") == "controller_restarted":
            warnings.append(f"the sandbox's controller restarted before event {event['seq']}: state may differ")
        elif event.get("event") == "budget":
            warnings.append(
                f"the recording stopped at event {event['seq']} ({event.get('reason', 'budget')}): "
                "the session's later actions were not recorded"
            )
        elif event.get("event") == "action" and "request" in (event.get("truncated") or {}):
            warnings.append(f"event {event['seq']}'s request was cut when recorded: that step is skipped")
    if bundle.truncated:
        warnings.append("the recording was cut short: its last, torn event is left out")
    return warnings


def _error_code(value: Any) -> str | None:
    return str(value.get("code")) if isinstance(value, dict) and value.get("code") is not None else None


def _outcome(event: Mapping[str, Any], reply: Mapping[str, Any]) -> str | None:
    """Why a step diverged by success or failure alone; None when both succeeded or both failed alike."""
    recorded_ok, replayed_ok = bool(event.get("ok")), bool(reply.get("ok"))
    recorded_code, replayed_code = _error_code(event.get("error")), _error_code(reply.get("error"))
    if replayed_ok != recorded_ok:
        reason = f"the request {'failed' if recorded_ok else 'succeeded'} this time"
        return reason + (f" ({replayed_code})" if replayed_code else "")
    if not recorded_ok and recorded_code != replayed_code:
        return f"the request failed with {replayed_code}, recorded {recorded_code}"
    return None


@dataclass(frozen=True, slots=True)
class _Step:
    """One recorded action on its way through the replay."""

    number: int
    event: RecordedEvent
    summary: str
    threshold: float
    override: StepOverride

    @property
    def recorded_ok(self) -> bool:
        return bool(self.event.get("ok"))

    def skipped(self, reason: str) -> StepVerdict:
        ok = self.recorded_ok
        on: JudgedOn = "result" if judged_by_result(self.event) else "screen"
        return StepVerdict(self.number, self.summary, ok, ok, self.threshold, None, "skipped", reason, judged_on=on)


@dataclass
class _Pace:
    """With ``recorded`` timing, each request waits until as long after the first as when recorded."""

    recorded: bool
    first: float | None
    start: float = field(default_factory=time.monotonic)

    def wait(self, event: Mapping[str, Any]) -> None:
        if self.recorded and self.first is not None and event.get("started"):
            wait = (float(event["started"]) - float(self.first)) - (time.monotonic() - self.start)
            if wait > 0:
                time.sleep(wait)


def replay(
    bundle: Bundle, send: Send, options: ReplayOptions, log: Callable[[str], None] = lambda _: None
) -> ReplayReport:
    """Send each recorded request through ``send`` (one sandbox's protocol), judge each step."""
    warnings = recording_warnings(bundle)
    for warning in warnings:
        log(f"warning: {warning}")
    actions = in_start_order(bundle.actions)  # as the requests came in, not as they ended
    pace = _Pace(options.recorded_timing, actions[0].get("started") if actions else None)
    pids = PidMap()  # a process's pid on replay differs from the recorded one
    steps: dict[int, StepVerdict] = {}
    running: dict[int, Future[StepVerdict]] = {}  # steps sent without waiting for their replies
    with ThreadPoolExecutor(thread_name_prefix="corral-replay") as pool:
        for number, event in enumerate(actions, start=1):
            # What had ended when this request came in (as recorded) has ended on replay too.
            for earlier in [n for n in running if not overlaps(actions[n - 1], event)]:
                steps[earlier] = _logged(running.pop(earlier).result(), log)
            override = options.overrides.get(number, StepOverride())
            threshold = override.threshold if override.threshold is not None else options.threshold
            step = _Step(number, event, summarize(event), threshold, override)
            later = actions[number] if number < len(actions) else None
            if later is not None and _beside(event, later):
                pids.expect(event)
                running[number] = pool.submit(_without_waiting, step, bundle, send, options, pids, pace)
                continue
            steps[number] = _logged(_replay_step(step, bundle, send, options, pids, pace), log)
        for number, future in running.items():
            steps[number] = _logged(future.result(), log)
    return ReplayReport(bundle.source, [steps[n] for n in sorted(steps)], warnings)


def _beside(event: Mapping[str, Any], later: Mapping[str, Any]) -> bool:
    """A command or file step that was still running when the next request came in: the replay sends
    it without waiting for its reply (a desktop step always waits: its frame is judged after it)."""
    return judged_by_result(event) and not is_transfer(event) and overlaps(event, later)


def _without_waiting(
    step: _Step, bundle: Bundle, send: Send, options: ReplayOptions, pids: PidMap, pace: _Pace
) -> StepVerdict:
    verdict = _replay_step(step, bundle, send, options, pids, pace)
    if verdict.status == "skipped":
        return verdict
    note = "; sent without waiting for its reply (as recorded, it still ran when the next request came in)"
    return dataclasses.replace(verdict, reason=verdict.reason + note)


def _logged(verdict: StepVerdict, log: Callable[[str], None]) -> StepVerdict:
    log(f"step {verdict.number} {_LOG_WORD[verdict.status]} {verdict.summary}: {verdict.reason}")
    return verdict


def _find_pid(pids: PidMap, request: Any, send: Send) -> None:
    """The replay's pid of an exec sent without waiting, which ``request`` names by its recorded pid:
    looked for among the running processes (``process_list``) until it shows or its exec ends."""
    pid = pids.unknown(request)
    if pid is None:
        return
    deadline = time.monotonic() + FIND_PID_S
    while pid not in pids.pids:
        listing = send({"action": {"type": "process_list"}})
        result = listing.get("result") if listing.get("ok") else None
        if pids.find(pid, result.get("processes") if isinstance(result, dict) else None):
            return
        if time.monotonic() >= deadline:
            return  # sent with the recorded pid: the step then says what the sandbox answered
        time.sleep(FIND_PID_POLL_S)


def _replay_step(
    step: _Step, bundle: Bundle, send: Send, options: ReplayOptions, pids: PidMap, pace: _Pace
) -> StepVerdict:
    if step.override.skip:
        return step.skipped("skipped by override")
    about_control = _about_control(step.event)
    if about_control is not None:
        return step.skipped(about_control)
    if "request" in (step.event.get("truncated") or {}):
        # Only part of it was kept (CORRAL_RECORDING_MAX_TEXT_KB): sending that would be another request.
        return step.skipped("the recorded request was cut (too long to keep whole); it cannot be sent again")
    cut = cut_upload(step.event)
    if cut is not None:
        return step.skipped(cut)  # a file_write's content, kept only in part: the rest was never stored
    typed = redacted_length(step.event)
    if typed is not None:
        # What a person typed (a password, most likely) was never recorded: typing something else in
        # its place would be another session. The steps after it may diverge; this one says why.
        return step.skipped(
            f"a person typed {typed} character(s) here, never recorded (redacted): not typed again; "
            "later steps may diverge"
        )
    pace.wait(step.event)
    if is_transfer(step.event):
        return _transferred(step, send)
    request = step.event.get("request")
    # Values the recording never kept (an exec's env) cannot be sent: the step goes without them.
    request, hidden = without_hidden(request)
    began = time.perf_counter()
    _find_pid(pids, request, send)
    # An unreadable message is sent again to be refused again.
    reply = send(pids.request(request)) if isinstance(request, dict) else send({"raw": request})
    elapsed = (time.perf_counter() - began) * 1000
    if judged_by_result(step.event):
        pids.learn(step.event, reply)
        verdict = _judged_by_result(step, reply, {**options.expect, **step.override.expect}, elapsed)
        if hidden:
            note = f"; sent without {', '.join(hidden)} (a recording keeps only the size and sha256 of env values)"
            verdict = dataclasses.replace(verdict, reason=verdict.reason + note)
        return verdict
    return _judged_by_frame(step, bundle, send, reply, options.masks + step.override.masks, elapsed)


def _about_control(event: Mapping[str, Any]) -> str | None:
    """Why a step of the control lease is not sent again: it waited for people, or it was refused
    while a human held control (it did nothing; the human's own steps, recorded, replay instead)."""
    native = event.get("native") or []
    if native and all(isinstance(step, dict) and step.get("type") in LEASE_TYPES for step in native):
        return f"{native[0].get('type')} waited for a person; a replay has none"
    if _error_code(event.get("error")) == "control_taken":
        return "refused with control_taken when recorded (someone else held control): it did nothing then"
    return None


def _judged_by_result(step: _Step, reply: Mapping[str, Any], expect: Mapping[str, str], elapsed: float) -> StepVerdict:
    """A command or file step: its exit code, digests and pids, never its screen."""
    checks: tuple[Check, ...] = ()
    outcome = _outcome(step.event, reply)
    if outcome is not None:
        passed, reason = False, outcome
    elif not step.recorded_ok:
        passed, reason = True, f"failed again with {_error_code(reply.get('error'))}, as recorded"
    else:
        judgement = judge(step.event, reply, expect)
        passed, reason, checks = judgement.passed, judgement.reason, judgement.checks
    return StepVerdict(
        step.number,
        step.summary,
        step.recorded_ok,
        bool(reply.get("ok")),
        step.threshold,
        None,
        "passed" if passed else "diverged",
        reason,
        elapsed_ms=elapsed,
        checks=checks,
        judged_on="result",
    )


def _transferred(step: _Step, send: Send) -> StepVerdict:
    """A file moved over HTTP: an upload skipped, a download re-checked (corral.recording.transfers)."""
    began = time.perf_counter()
    verdict = replay_transfer(step.event, send)
    return StepVerdict(
        step.number,
        step.summary,
        step.recorded_ok,
        verdict.replayed_ok,
        step.threshold,
        None,
        verdict.status,
        verdict.reason,
        elapsed_ms=(time.perf_counter() - began) * 1000,
        checks=verdict.checks,
        judged_on="result",
    )


def _judged_by_frame(
    step: _Step, bundle: Bundle, send: Send, reply: Mapping[str, Any], masks: tuple[Mask, ...], elapsed: float
) -> StepVerdict:
    """Any other step: its screen, once settled, against the recorded frame."""
    shot = send(FRAME_REQUEST)
    replayed = base64.b64decode(shot["screenshot"]["data"]) if shot.get("ok") and shot.get("screenshot") else None
    recorded = bundle.frame(step.event)
    score: float | None = None
    diff = None
    status: StepStatus
    outcome = _outcome(step.event, reply)
    if outcome is not None:
        status, reason = "diverged", outcome
    elif recorded is None or replayed is None:
        why = "the recording has no frame for it" if recorded is None else "the replay's screenshot failed"
        status, reason = "skipped", f"no frame to compare: {why}"
    else:
        comparison = compare(recorded, replayed, masks)
        score, diff = comparison.score, comparison.diff_png
        status = "passed" if score <= step.threshold else "diverged"
        reason = f"{score:.2%} of the screen differs (threshold {step.threshold:.2%})"
        if step.event.get("frame_settled") is False:
            # Recorded before the screen had settled (the next request came first): say so.
            reason += "; the recorded frame was taken before the screen settled"
            if status == "diverged":
                reason += " (mask the moving part, raise this step's threshold, or re-record)"
    return StepVerdict(
        step.number,
        step.summary,
        step.recorded_ok,
        bool(reply.get("ok")),
        step.threshold,
        score,
        status,
        reason,
        recorded,
        replayed,
        diff,
        elapsed,
    )


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
        skipped=str(len(report.skipped)),
    )
    if report.warnings:
        properties = ET.SubElement(suite, "properties")
        for warning in report.warnings:
            ET.SubElement(properties, "property", name="warning", value=_xml_text(warning))
    for step in report.steps:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=_xml_text(report.source),
            name=_xml_text(f"step {step.number}: {step.summary}"),
            time=f"{step.elapsed_ms / 1000:.3f}",
        )
        if step.status == "skipped":
            ET.SubElement(case, "skipped", message=_xml_text(step.reason))
        elif not step.passed:
            ET.SubElement(case, "failure", message=_xml_text(step.reason)).text = _xml_text(step.reason)
        if step.checks:
            ET.SubElement(case, "system-out").text = _xml_text("\n".join(str(check) for check in step.checks))
    if report.warnings:
        ET.SubElement(suite, "system-out").text = _xml_text("\n".join(f"warning: {w}" for w in report.warnings))
    return bytes(ET.tostring(suite, encoding="utf-8", xml_declaration=True))


def _img(data: bytes | None, mime: str, alt: str) -> str:
    if data is None:
        return f"<div class=none>{html.escape(alt)}: none</div>"
    return f"<img alt='{html.escape(alt)}' src='data:{mime};base64,{base64.b64encode(data).decode()}'>"


_VERDICT = {"passed": "passed", "diverged": "DIVERGED", "skipped": "skipped"}


def _compared(step: StepVerdict) -> str:
    """What the step was judged on: its result's checks (a command or file step), else the frames."""
    if step.checks:
        rows = "".join(
            f"<tr class={'pass' if c.passed else 'fail'}><td>{html.escape(c.name)}</td>"
            f"<td>{html.escape(c.recorded)}</td><td>{html.escape(c.replayed)}</td>"
            f"<td>{'matches' if c.passed else 'DIFFERS'}</td></tr>"
            for c in step.checks
        )
        return f"<table class=checks><tr><th>checked</th><th>recorded</th><th>replayed</th><th></th></tr>{rows}</table>"
    if step.judged_on == "result":
        return ""  # a command or file step judged by its success alone: no frames to show
    return (
        "<div class=frames>"
        f"<figure>{_img(step.recorded_frame, 'image/webp', 'recorded')}<figcaption>recorded</figcaption></figure>"
        f"<figure>{_img(step.replayed_frame, 'image/webp', 'replayed')}<figcaption>replayed</figcaption></figure>"
        f"<figure>{_img(step.diff_png, 'image/png', 'difference')}<figcaption>difference</figcaption></figure>"
        "</div>"
    )


def html_report(report: ReplayReport) -> str:
    """One self-contained page: each step with the recorded, replayed and difference images."""
    rows = []
    for step in report.steps:
        state = {"passed": "pass", "diverged": "fail", "skipped": "skip"}[step.status]
        rows.append(
            f"<section class='step {state}' id='step-{step.number}'>"
            f"<h2>Step {step.number}: {html.escape(step.summary)} "
            f"<span class=verdict>{_VERDICT[step.status]}</span></h2>"
            f"<p class=reason>{html.escape(step.reason)}</p>{_compared(step)}</section>"
        )
    verdict = "passed" if report.passed else f"{len(report.divergences)} step(s) diverged"
    if report.skipped:
        verdict += f", {len(report.skipped)} skipped"
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in report.warnings)
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>Corral replay: {html.escape(verdict)}</title><style>"
        "body{font:14px sans-serif;margin:1em}.frames{display:flex;gap:8px}figure{margin:0}"
        "img{width:400px;border:1px solid #ccc}.fail h2{color:#b00}.pass h2{color:#070}.skip h2{color:#666}"
        ".warnings{color:#a60}.checks{border-collapse:collapse}.checks td,.checks th{border:1px solid #ccc;"
        "padding:2px 6px;font-family:monospace}.checks tr.fail{color:#b00}"
        "</style></head><body>"
        f"<h1 id=summary>Replay of {html.escape(report.source)}: {html.escape(verdict)}</h1>"
        + (f"<ul class=warnings id=warnings>{warnings}</ul>" if warnings else "")
        + "".join(rows)
        + "</body></html>"
    )
