"""``sb.run_code(...)``'s answer as E2B's code-interpreter SDK names it (pure): :class:`Execution`
(``results``, ``logs``, ``error``, ``execution_count``, ``text``), each :class:`Result` with its
formats as attributes (``text``, ``html``, ``png`` as base64 text, ``json`` parsed, ...), and the
streamed events of a ``run_code`` as its callbacks hear them (:class:`OutputMessage`, :class:`Result`).

Made from the action's result models (:class:`~corral.protocol.results.CodeExecution`,
:class:`~corral.protocol.results.CodeOutput`), never from the reply's raw JSON: docs/sdk.md's rule.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.errors import CorralError
from corral.protocol import results as r

# E2B's attribute name of each MIME type a result carries, in E2B's order of ``formats()``.
FORMATS: dict[str, r.CodeMime] = {
    "text": "text/plain",
    "html": "text/html",
    "markdown": "text/markdown",
    "svg": "image/svg+xml",
    "png": "image/png",
    "jpeg": "image/jpeg",
    "latex": "text/latex",
    "json": "application/json",
    "javascript": "application/javascript",
}
IMAGE_FORMATS = ("png", "jpeg")  # base64 on the wire; svg is text


@dataclass(frozen=True, slots=True)
class Result:
    """One display or execute result of a cell (E2B's ``Result``): each format an attribute, None
    when the bundle lacks it. Images are base64 text as E2B gives them (:meth:`image_bytes` decodes)."""

    data: Mapping[str, str]  # the MIME bundle as the kernel sent it: type -> text (images base64)
    is_main_result: bool = False
    omitted: tuple[str, ...] = ()  # MIME types the sandbox left out (too large, or not one it carries)

    @classmethod
    def of(cls, output: r.CodeOutput) -> Result:
        return cls(
            {str(mime): text for mime, text in output.data.items()}, output.is_main_result, tuple(output.omitted)
        )

    def _get(self, name: str) -> str | None:
        return self.data.get(FORMATS[name])

    @property
    def text(self) -> str | None:
        return self._get("text")

    @property
    def html(self) -> str | None:
        return self._get("html")

    @property
    def markdown(self) -> str | None:
        return self._get("markdown")

    @property
    def svg(self) -> str | None:
        return self._get("svg")

    @property
    def png(self) -> str | None:
        return self._get("png")

    @property
    def jpeg(self) -> str | None:
        return self._get("jpeg")

    @property
    def latex(self) -> str | None:
        return self._get("latex")

    @property
    def javascript(self) -> str | None:
        return self._get("javascript")

    @property
    def json(self) -> Any:
        """The ``application/json`` format parsed (None without it). The sandbox sends it as text, so
        no result is open-ended JSON on the wire; text that is not JSON is a :class:`CorralError`."""
        raw = self._get("json")
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise CorralError("the result's application/json is not JSON") from None

    def formats(self) -> list[str]:
        """The formats this result has, by E2B's names (``text``, ``html``, ``png``, ...)."""
        return [name for name, mime in FORMATS.items() if self.data.get(mime)]

    def image_bytes(self) -> tuple[str, bytes] | None:
        """The first image format and its decoded bytes (``("png", b"\\x89PNG...")``), None without
        one; an SVG's text is ``("svg", text.encode())``."""
        for name in IMAGE_FORMATS:
            encoded = self._get(name)
            if encoded:
                try:
                    return name, base64.b64decode(encoded, validate=True)
                except (binascii.Error, ValueError):
                    raise CorralError(f"the result's {name} is not base64") from None
        svg = self.svg
        return ("svg", svg.encode()) if svg else None

    def __repr__(self) -> str:
        return f"Result({self.text})" if self.text else f"Result(Formats: {', '.join(self.formats())})"


@dataclass(frozen=True, slots=True)
class Logs:
    """What the cell printed, chunk by chunk (E2B's ``Logs``)."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    truncated: bool = False  # past max_output_bytes: later chunks were dropped


@dataclass(frozen=True, slots=True)
class ExecutionError:
    """The cell's exception (E2B's ``ExecutionError``); ``Timeout``, ``KernelDied`` and
    ``KernelRestarted`` name Corral's own ends of a cell."""

    name: str
    value: str
    traceback: str

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "value": self.value, "traceback": self.traceback})


@dataclass(frozen=True, slots=True)
class OutputMessage:
    """One chunk a streamed cell printed, as ``on_stdout``/``on_stderr`` hear it (E2B's name)."""

    line: str
    timestamp: int  # unix nanoseconds, when this client read it
    error: bool = False  # stderr

    def __str__(self) -> str:
        return self.line


@dataclass(frozen=True, slots=True)
class Execution:
    """A cell's run (E2B's ``Execution``), with Corral's extras: the ``context``, whether it
    ``timed_out`` (the kernel kept), whether the context's ``state_lost`` (its kernel died or was
    restarted), and ``duration_ms``."""

    results: list[Result]
    logs: Logs
    error: ExecutionError | None
    execution_count: int | None
    context: str
    timed_out: bool = False
    state_lost: bool = False
    duration_ms: float | None = None

    @classmethod
    def of(cls, run: r.CodeExecution) -> Execution:
        error = None if run.error is None else ExecutionError(run.error.name, run.error.value, run.error.traceback)
        return cls(
            results=[Result.of(output) for output in run.results],
            logs=Logs(list(run.logs.stdout), list(run.logs.stderr), run.logs.truncated),
            error=error,
            execution_count=run.execution_count,
            context=run.context,
            timed_out=run.timed_out,
            state_lost=run.state_lost,
            duration_ms=run.duration_ms,
        )

    @property
    def text(self) -> str | None:
        """The main result's ``text/plain`` (the cell's value), None without one."""
        return next((result.text for result in self.results if result.is_main_result), None)

    def to_json(self) -> str:
        """E2B's ``to_json``: results by format name, logs, error."""
        results = [
            {name: res.json if name == "json" else res.data[mime] for name, mime in _carried(res)}
            for res in self.results
        ]
        logs = {"stdout": self.logs.stdout, "stderr": self.logs.stderr}
        error = None if self.error is None else json.loads(self.error.to_json())
        return json.dumps({"results": results, "logs": logs, "error": error})

    def __repr__(self) -> str:
        return f"Execution(Results: {self.results}, Logs: {self.logs}, Error: {self.error})"


def _carried(result: Result) -> list[tuple[str, str]]:
    """The formats ``result`` carries: (E2B's name, its MIME type)."""
    return [(name, mime) for name, mime in FORMATS.items() if mime in result.data]


CodeEvent = OutputMessage | Result


def with_streamed(execution: Execution, events: Iterable[CodeEvent]) -> Execution:
    """The reply's execution, with what was streamed where the reply left it out (a sandbox that
    does not repeat a streamed cell's output in its reply, as exec_stream's ``max_output_bytes=0``
    does): each part taken from the events only when the reply's is empty."""
    seen = list(events)
    results = execution.results or [event for event in seen if isinstance(event, Result)]
    printed = [event for event in seen if isinstance(event, OutputMessage)]
    stdout = execution.logs.stdout or [event.line for event in printed if not event.error]
    stderr = execution.logs.stderr or [event.line for event in printed if event.error]
    return dataclasses.replace(execution, results=results, logs=Logs(stdout, stderr, execution.logs.truncated))
