"""One cell's messages folded into run_code's answer, pure: :class:`Cell` takes each message the
kernel sent about the request (IOPub's and the shell's reply), keeps what fits, and says which
events a streamed call sends. What it keeps is bounded however much the kernel sends: the logs by
the call's ``max_output_bytes`` (and their JSON by :data:`LOGS_JSON_BYTES`), the results together
by :data:`RESULTS_BYTES`, so that a reply always fits one frame (:data:`MAX_FRAME_BYTES`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from corral.contracts.limits import MAX_FRAME_BYTES
from corral.protocol import results as r
from corral.sandbox.kernels import bundle
from corral.sandbox.kernels.wire import Message

# A reply's room: the logs' JSON, the results', the error's (bundle's caps) and the rest with room.
LOGS_JSON_BYTES = 9 << 20
RESULTS_BYTES = 5 << 20
MAX_RESULTS = 1_000  # displays kept (a loop of display() calls); later ones are counted as dropped
assert LOGS_JSON_BYTES + RESULTS_BYTES + bundle.MAX_TRACEBACK + (1 << 20) <= MAX_FRAME_BYTES

Event = r.OutputEvent | r.CodeResultEvent


@dataclass(slots=True)
class Cell:
    """What one ``execute_request`` (``msg_id``) gave so far."""

    msg_id: str
    max_output_bytes: int
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    log_bytes: int = 0
    log_json: int = 0
    truncated: bool = False
    results: list[r.CodeOutput] = field(default_factory=list)
    results_bytes: int = 0
    error: r.CodeError | None = None
    execution_count: int | None = None
    idle: bool = False  # IOPub said the kernel is idle after this request
    replied: bool = False  # the shell's execute_reply came
    iopub_lost: bool = False  # replied, but IOPub's idle never came: its connection was dropped

    @property
    def done(self) -> bool:
        return self.idle and self.replied

    def take(self, message: Message) -> list[Event]:
        """Fold one message in; the events a streamed call sends for it. Another request's are ignored."""
        if message.parent_id != self.msg_id:
            return []
        content = message.content
        match message.msg_type:
            case "stream":
                return self._stream(content.get("name"), content.get("text"))
            case "display_data" | "update_display_data" | "execute_result":
                return self._result(content.get("data"), main=message.msg_type == "execute_result")
            case "error":
                self.error = bundle.error(content)
            case "execute_input" | "execute_reply":
                count = content.get("execution_count")
                if isinstance(count, int) and not isinstance(count, bool):
                    self.execution_count = count
                if message.msg_type == "execute_reply":
                    self.replied = True
                    if content.get("status") == "error" and self.error is None:
                        self.error = bundle.error(content)
            case "status":
                if content.get("execution_state") == "idle":
                    self.idle = True
        return []

    def _stream(self, name: object, text: object) -> list[Event]:
        if name not in ("stdout", "stderr") or not isinstance(text, str) or not text:
            return []
        if self.truncated:
            return []
        room = self.max_output_bytes - self.log_bytes
        data = text.encode()
        if len(data) > room:
            text, self.truncated = data[: max(0, room)].decode(errors="ignore"), True
        size = len(json.dumps(text)) + 1
        if self.log_json + size > LOGS_JSON_BYTES:
            self.truncated = True
            return []
        if not text:
            return []
        self.log_bytes += len(text.encode())
        self.log_json += size
        (self.stdout if name == "stdout" else self.stderr).append(text)
        return [r.OutputEvent(stream=name, data=text, encoding="utf-8")]

    def _result(self, data: object, *, main: bool) -> list[Event]:
        if len(self.results) >= MAX_RESULTS:
            return []
        out, used = bundle.output(data, main=main, budget=RESULTS_BYTES - self.results_bytes)
        self.results.append(out)
        self.results_bytes += used + 64  # the CodeOutput's own keys
        return [r.CodeResultEvent(result=out)]

    def logs(self) -> r.CodeLogs:
        return r.CodeLogs(stdout=self.stdout, stderr=self.stderr, truncated=self.truncated)
