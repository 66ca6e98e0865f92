"""Progress of long jobs that run side by side (the image builds), for a terminal or for a log.

On a terminal one status line shows every task's current step. Anywhere else (CI, a pipe, a
file) each step is a plain line of its own, and a task that has printed nothing for ``interval_s``
gets a line saying where it is and what its builder printed last: a silent build looks the same
as a hung one, so a log never goes quiet for longer than that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

# A line at least every 10 s: the heartbeat looks twice a second, so it speaks after 9 s of quiet.
HEARTBEAT_S = 9.0
LOOK_S = 0.5
DETAIL_CHARS = 100

Clock = Callable[[], float]
Write = Callable[[str], None]


class Status(Protocol):
    """A terminal's one-line status (rich's ``Console.status``, or a fake)."""

    def update(self, status: str) -> None: ...


def is_step(line: str) -> bool:
    """Whether a builder's line starts a Dockerfile step (the classic builder's ``Step 3/17 : RUN``)."""
    return line.startswith("Step ")


@dataclass
class _State:
    step: str = "waiting to start"
    detail: str = ""
    started: float = 0.0
    last_printed: float = 0.0
    done: bool = False


class Task:
    """One job's log: ``step`` for what it starts, ``output`` for its builder's lines."""

    def __init__(self, progress: Progress, name: str) -> None:
        self._progress = progress
        self.name = name

    def step(self, text: str) -> None:
        self._progress.step(self.name, text)

    def output(self, line: str) -> None:
        self._progress.output(self.name, line)

    def done(self, text: str) -> None:
        self._progress.done(self.name, text)


class Progress:
    """The tasks' steps, shown on a terminal's status line or written as plain lines.

    Thread-safe: each task reports from its own thread. ``beat`` writes the quiet tasks' lines;
    use it as a context manager to have a thread call it every ``interval_s``.
    """

    def __init__(
        self,
        write: Write,
        *,
        status: Status | None = None,
        interval_s: float = HEARTBEAT_S,
        clock: Clock = time.monotonic,
    ) -> None:
        self._write = write
        self._status = status
        self._interval_s = interval_s
        self._clock = clock
        self._start = clock()
        self._tasks: dict[str, _State] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None

    def task(self, name: str) -> Task:
        now = self._clock()
        with self._lock:
            self._tasks[name] = _State(started=now, last_printed=now)
        return Task(self, name)

    def step(self, name: str, text: str) -> None:
        with self._lock:
            state = self._tasks[name]
            state.step, state.detail = text, ""
            self._show(name, text, state)

    def output(self, name: str, line: str) -> None:
        if is_step(line):
            self.step(name, line[:DETAIL_CHARS])
            return
        with self._lock:
            self._tasks[name].detail = line.strip()[:DETAIL_CHARS]
            self._refresh()

    def done(self, name: str, text: str) -> None:
        with self._lock:
            state = self._tasks[name]
            state.done = True
            self._show(name, text, state)

    def beat(self) -> None:
        """A line for each running task that has printed nothing for ``interval_s`` (plain mode only)."""
        if self._status is not None:
            return
        now = self._clock()
        with self._lock:
            for name, state in self._tasks.items():
                if state.done or now - state.last_printed < self._interval_s:
                    continue
                last = f" (last: {state.detail})" if state.detail else ""
                self._line(name, f"still at {state.step}: {now - state.started:.0f} s in{last}", state, now)

    def _show(self, name: str, text: str, state: _State) -> None:
        if self._status is None:
            self._line(name, text, state, self._clock())
        else:
            self._refresh()

    def _line(self, name: str, text: str, state: _State, now: float) -> None:
        state.last_printed = now
        self._write(f"[{now - self._start:5.0f} s] {name}: {text}")

    def _refresh(self) -> None:
        if self._status is not None:
            running = [f"{name}: {state.step}" for name, state in self._tasks.items() if not state.done]
            self._status.update(" | ".join(running) or "done")

    # -- the heartbeat thread --------------------------------------------------------------------------

    def __enter__(self) -> Progress:
        if self._status is None:
            self._beater = threading.Thread(target=self._beat_until_stopped, name="progress-heartbeat", daemon=True)
            self._beater.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._beater is not None:
            self._beater.join()

    def _beat_until_stopped(self) -> None:
        # A task goes quiet at any moment, its line is due interval_s after: look often, speak rarely.
        while not self._stop.wait(min(LOOK_S, self._interval_s)):
            self.beat()
