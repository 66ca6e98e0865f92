"""Judging a replayed command or file step by its result, not by the screen.

An ``exec`` passes when its exit code (or, killed, its signal) matches the recording's; its stdout and
stderr are compared only when the step asks (``expect: {"stdout": "exact"}``), by sha256, so an
output the recording kept only the start of still compares whole. ``file_write`` and ``file_read``
compare the sha256 of the file written or the bytes read where the recording has one;
``process_wait`` the exit code of a process that had ended; ``run_code`` its error, its results' texts
and images, and its logs when asked (:mod:`corral.recording.codejudge`). Process steps name a pid: the replay's
processes have other pids, so each recorded pid is mapped to the one the replay got for the same
``exec`` (:class:`PidMap`). The tools over commands and files (``shell``, ``edit``, ...) are judged by
their result too; a vendor call (a ``tool_result`` or an output ``item`` in the reply) by its outcome: a
shell_call's per-command outcomes, a local_shell_call's exit code. Every other command or file step
passes when it succeeds again (or fails again with the same code), which replay.py checks before it
gets here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.recording.codejudge import code_checks
from corral.recording.redact import (
    CODE_FIELDS,
    HIDDEN_FIELDS,
    INPUT_FIELDS,
    PAYLOADS,
    digest,
    is_hidden,
    vendor_exec,
)

COMMAND_TYPES = frozenset(
    {"exec", "process_list", "process_wait", "process_kill", "process_write", "process_output", "process_resize"}
)
FILE_TYPES = frozenset({"file_read", "file_write", "file_list", "file_stat", "file_remove", "file_move"})
# The tools over commands and files (what the vendors' shell, editor and patch tools become).
TOOL_TYPES = frozenset({"shell", "edit", "apply_patch", "file_glob", "file_grep"})
# The code interpreter's (corral.recording.codejudge judges run_code's outputs).
CODE_TYPES = frozenset({"run_code", "list_code_contexts", "restart_code_context", "remove_code_context"})
# Files moved over HTTP (PUT/GET /v1/files), recorded as steps of these types (corral.recording.transfers).
UPLOAD, DOWNLOAD = "file_upload", "file_download"
TRANSFER_TYPES = frozenset({UPLOAD, DOWNLOAD})
STREAMS = ("stdout", "stderr")
Expectation = Literal["exact", "ignore"]
EXPECTATIONS: tuple[Expectation, ...] = ("exact", "ignore")


@dataclass(frozen=True, slots=True)
class Check:
    """One thing compared: what the recording says, what the replay gave, and whether they match."""

    name: str
    recorded: str
    replayed: str
    passed: bool

    def __str__(self) -> str:
        word = "matches" if self.passed else "differs"
        return f"{self.name} {word}: {self.replayed}, recorded {self.recorded}"


@dataclass(frozen=True, slots=True)
class Judgement:
    passed: bool
    reason: str
    checks: tuple[Check, ...] = ()


def action_type(event: Mapping[str, Any]) -> str | None:
    """The type of the (last) native action the event's request became, else the request's own."""
    native = event.get("native")
    request = event.get("request")
    action = native[-1] if isinstance(native, list) and native else None
    if action is None and isinstance(request, dict):
        action = request.get("action")
    kind = action.get("type") if isinstance(action, dict) else None
    return kind if isinstance(kind, str) else None


def judged_by_result(event: Mapping[str, Any]) -> bool:
    """A command or file step: its result is compared, never its screen."""
    return action_type(event) in COMMAND_TYPES | FILE_TYPES | TOOL_TYPES | TRANSFER_TYPES | CODE_TYPES


def cut_upload(event: Mapping[str, Any]) -> str | None:
    """Why the recorded request cannot be sent again: an upload kept only in part (else None)."""
    payloads = event.get(PAYLOADS)
    if not isinstance(payloads, dict):
        return None
    for path, entry in payloads.items():
        if str(path).startswith("request.") and isinstance(entry, dict) and entry.get("truncated"):
            name = str(path).rsplit(".", 1)[-1]
            return (
                f"the recording kept only the start of its {name} ({entry.get('size')} bytes, sha256 "
                f"{str(entry.get('sha256'))[:12]}…); it cannot be sent again"
            )
    return None


def without_hidden(request: Any) -> tuple[Any, tuple[str, ...]]:
    """The request with the values the recording hid (``exec``'s ``env``: only their size and sha256
    were kept) left out, and the names of those left out (``env`` itself when it was hidden whole).
    A ``local_shell_call``'s exec (``openai.action``) is cleaned the same way."""
    if not isinstance(request, dict):
        return request, ()
    vendor = vendor_exec(request)
    action = request.get("action") if vendor is None else vendor
    if not isinstance(action, dict):
        return request, ()
    kept, left_out = dict(action), []
    for key in HIDDEN_FIELDS.get(str(action.get("type")), ()):
        value = action.get(key)
        if is_hidden(value):
            del kept[key]
            left_out.append(key)
        elif isinstance(value, dict):
            kept[key] = {name: item for name, item in value.items() if not is_hidden(item)}
            left_out += [f"{key}.{name}" for name, item in value.items() if is_hidden(item)]
    if not left_out:
        return request, ()
    if vendor is not None:
        return {**request, "openai": {**request["openai"], "action": kept}}, tuple(left_out)
    return {**request, "action": kept}, tuple(left_out)


@dataclass
class PidMap:
    """Recorded pid -> the replay's pid of the same process, learnt from each ``exec``'s result, or,
    for an ``exec`` the replay sent without waiting for its reply (it was still running when a later
    request came in), found among the replay's running processes (:meth:`find`)."""

    pids: dict[int, int] = field(default_factory=dict)
    pending: dict[int, dict[str, Any]] = field(default_factory=dict)  # recorded pid -> its exec, running

    def expect(self, event: Mapping[str, Any]) -> None:
        """An ``exec`` sent without waiting: its recorded pid is to be found among the replay's processes."""
        native = event.get("native")
        pid = _result(event.get("reply")).get("pid")
        if action_type(event) == "exec" and isinstance(native, list) and isinstance(pid, int):
            self.pending[pid] = native[-1]

    def unknown(self, request: Any) -> int | None:
        """The recorded pid ``request`` names that an ``exec`` still running on replay will have, if any."""
        action = request.get("action") if isinstance(request, dict) else None
        pid = action.get("pid") if isinstance(action, dict) and action.get("type") in COMMAND_TYPES else None
        return pid if isinstance(pid, int) and pid in self.pending and pid not in self.pids else None

    def find(self, pid: int, processes: Any) -> bool:
        """Map ``pid`` to the running process of ``process_list``'s answer that its exec started."""
        action, taken = self.pending[pid], set(self.pids.values())
        for process in processes if isinstance(processes, list) else []:
            if not isinstance(process, dict) or process.get("pid") in taken or not process.get("running"):
                continue
            key = "command" if action.get("command") is not None else "argv"
            if process.get(key) == action.get(key) and isinstance(process.get("pid"), int):
                self.pids[pid] = int(process["pid"])
                return True
        return False

    def request(self, request: Any) -> Any:
        """The request with its action's recorded pid replaced by the replay's (a copy; else as it is)."""
        action = request.get("action") if isinstance(request, dict) else None
        if not isinstance(action, dict) or action.get("type") not in COMMAND_TYPES:
            return request
        pid = action.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and pid in self.pids:
            return {**request, "action": {**action, "pid": self.pids[pid]}}
        return request

    def learn(self, event: Mapping[str, Any], reply: Mapping[str, Any]) -> None:
        if action_type(event) != "exec":
            return
        recorded, replayed = _result(event.get("reply")).get("pid"), _result(reply).get("pid")
        if isinstance(recorded, int) and isinstance(replayed, int):
            self.pids[recorded] = replayed


def _result(reply: Any) -> dict[str, Any]:
    result = reply.get("result") if isinstance(reply, Mapping) else None
    return result if isinstance(result, dict) else {}


def _recorded_digest(event: Mapping[str, Any], key: str) -> tuple[int, str] | None:
    """Size and sha256 of a recorded result field: from ``payloads``, else from the text itself."""
    payloads = event.get(PAYLOADS)
    entry = payloads.get(f"reply.result.{key}") if isinstance(payloads, dict) else None
    if isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("size"), int):
        return int(entry["size"]), str(entry["sha256"])
    result = _result(event.get("reply"))
    text = result.get(key)
    cut = event.get("truncated")
    if not isinstance(text, str) or (isinstance(cut, dict) and "reply" in cut):
        return None  # no digest, and the text itself was cut: nothing whole to compare
    return digest(text, result.get("encoding") == "base64")


def _described(size: int, sha256: str) -> str:
    return f"{size} bytes, sha256 {sha256[:12]}…"


def _digest_check(name: str, recorded: tuple[int, str] | None, replayed: tuple[int, str] | None) -> list[Check]:
    if recorded is None or replayed is None:
        return []
    return [Check(name, _described(*recorded), _described(*replayed), recorded[1] == replayed[1])]


def _ended(result: Mapping[str, Any]) -> str:
    """How a process ended, as the exit code or the signal that killed it."""
    if result.get("exit_code") is not None:
        return str(result["exit_code"])
    return f"killed by {result['signal']}" if result.get("signal") else "none"


def _exec_checks(event: Mapping[str, Any], reply: Mapping[str, Any], expect: Mapping[str, str]) -> list[Check]:
    recorded, replayed = _result(event.get("reply")), _result(reply)
    if recorded.get("background"):
        pid = f"pid {recorded.get('pid')} is pid {replayed.get('pid')} now"
        return [Check("background start", pid, pid, bool(replayed.get("background")))]
    checks = [Check("exit code", _ended(recorded), _ended(replayed), _ended(recorded) == _ended(replayed))]
    if recorded.get("timed_out") or replayed.get("timed_out"):
        timed = str(bool(recorded.get("timed_out"))), str(bool(replayed.get("timed_out")))
        checks.append(Check("timed out", timed[0], timed[1], timed[0] == timed[1]))
    for stream in STREAMS:
        if expect.get(stream) == "exact":
            text = replayed.get(stream)
            mine = digest(text, replayed.get("encoding") == "base64") if isinstance(text, str) else (0, "none")
            checks += _digest_check(stream, _recorded_digest(event, stream), mine)
    return checks


def _file_checks(kind: str, event: Mapping[str, Any], reply: Mapping[str, Any]) -> list[Check]:
    recorded, replayed = _result(event.get("reply")), _result(reply)
    if kind == "file_write":
        theirs, mine = recorded.get("sha256"), replayed.get("sha256")
        if isinstance(theirs, str):
            size, new_size = int(recorded.get("size") or 0), int(replayed.get("size") or 0)
            return _digest_check("sha256", (size, theirs), (new_size, str(mine)))
    if kind == "file_read":
        content = replayed.get("content")
        mine_digest = digest(content, replayed.get("encoding") == "base64") if isinstance(content, str) else None
        return _digest_check("content sha256", _recorded_digest(event, "content"), mine_digest)
    return []


def _wait_checks(event: Mapping[str, Any], reply: Mapping[str, Any]) -> list[Check]:
    recorded, replayed = _result(event.get("reply")), _result(reply)
    if recorded.get("running") is not False:
        return []  # the recorded wait ran out: how far a process got is timing, not a result
    if replayed.get("running"):
        return [Check("exit code", _ended(recorded), "still running when the wait ran out", False)]
    return [Check("exit code", _ended(recorded), _ended(replayed), _ended(recorded) == _ended(replayed))]


def _vendor_outcome(result: Mapping[str, Any]) -> str:
    """What a vendor call's output says of how its commands ended ("" when it says nothing of it)."""
    item = result.get("item")
    if not isinstance(item, dict):
        return ""
    if item.get("type") == "shell_call_output" and isinstance(item.get("output"), list):
        outcomes = [entry.get("outcome") for entry in item["output"] if isinstance(entry, dict)]
        return ", ".join(
            f"exit {o.get('exit_code')}" if o.get("type") == "exit" else str(o.get("type"))
            for o in outcomes
            if isinstance(o, dict)
        )
    if item.get("type") == "local_shell_call_output":
        try:
            metadata = json.loads(str(item.get("output"))).get("metadata") or {}
        except (ValueError, AttributeError):
            return ""
        return f"exit {metadata.get('exit_code')}" if isinstance(metadata, dict) else ""
    return ""


def _vendor_checks(event: Mapping[str, Any], reply: Mapping[str, Any]) -> list[Check]:
    recorded, replayed = _vendor_outcome(_result(event.get("reply"))), _vendor_outcome(_result(reply))
    return [Check("outcome", recorded, replayed, recorded == replayed)] if recorded else []


def is_vendor_reply(reply: Any) -> bool:
    """A reply to a vendor call: its result is a ``tool_result`` block or an output ``item``."""
    result = _result(reply)
    return "tool_result" in result or "item" in result


def judge(event: Mapping[str, Any], reply: Mapping[str, Any], expect: Mapping[str, str]) -> Judgement:
    """A command or file step that succeeded both times, judged by its result."""
    kind = action_type(event) or ""
    if is_vendor_reply(event.get("reply")):
        checks = _vendor_checks(event, reply)
    elif kind == "exec":
        checks = _exec_checks(event, reply, expect)
    elif kind == "process_wait":
        checks = _wait_checks(event, reply)
    elif kind == "run_code":
        checks = [Check(*check) for check in code_checks(event, reply, expect)]
    else:
        checks = _file_checks(kind, event, reply)
    failed = [check for check in checks if not check.passed]
    if failed:
        return Judgement(False, "; ".join(str(check) for check in failed), tuple(checks))
    if checks:
        return Judgement(True, "; ".join(str(check) for check in checks), tuple(checks))
    return Judgement(True, f"{kind} succeeded again (judged by its result, not the screen)")


def summary_fields(kind: str | None) -> frozenset[str]:
    """Fields of an action left out of a one-line summary: uploaded bytes say nothing there."""
    return frozenset(INPUT_FIELDS.get(kind or "", ()) + CODE_FIELDS.get(kind or "", ()))
