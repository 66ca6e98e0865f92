"""Replaying a file moved over HTTP (``PUT``/``GET /v1/files``, recorded as ``file_upload`` and
``file_download`` steps): it is never sent again over HTTP, since a replay speaks the protocol.

- An upload's bytes are not in the recording (only their size and sha256): the step is **skipped**,
  saying so; later steps that read the file then diverge, each with its reason.
- A download is **re-checked** as the agent would see the file: a ``file_stat`` of its path must
  succeed (or fail with the recorded code), and for a whole file the replay runs ``sha256sum`` on it
  and compares with the sha256 of the bytes sent when recorded. A directory's tar is not compared
  byte for byte (tar carries mtimes and a listing order): that it is still a directory is the check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, cast

from corral.recording.judge import TRANSFER_TYPES, UPLOAD, Check, action_type

Send = Callable[[dict[str, Any]], dict[str, Any]]  # a request sent as JSON, its reply: any action's


class TransferStep(TypedDict, total=False):
    """A recorded transfer's native step (corral.sandbox.tools.transfer_record): its kind and path."""

    type: str  # file_upload, file_download
    path: str
    path_base64: str


class TransferResult(TypedDict, total=False):
    """A recorded transfer's result: what was moved."""

    direction: str
    type: str  # file, directory (a download)
    size: int
    sha256: str
    complete: bool


@dataclass(frozen=True, slots=True)
class TransferVerdict:
    status: Literal["passed", "diverged", "skipped"]
    reason: str
    checks: tuple[Check, ...] = ()
    replayed_ok: bool = False


def is_transfer(event: Mapping[str, Any]) -> bool:
    return action_type(event) in TRANSFER_TYPES


def _step(event: Mapping[str, Any]) -> TransferStep:
    """As recorded (read back: each value used is checked)."""
    native = event.get("native")
    step = native[-1] if isinstance(native, list) and native else None
    return cast(TransferStep, step) if isinstance(step, dict) else {}


def _result(event: Mapping[str, Any]) -> TransferResult:
    """As recorded (read back: each value used is checked)."""
    reply = event.get("reply")
    result = reply.get("result") if isinstance(reply, dict) else None
    return cast(TransferResult, result) if isinstance(result, dict) else {}


def _code(reply: Mapping[str, Any]) -> str | None:
    error = reply.get("error")
    return str(error.get("code")) if isinstance(error, dict) else None


def replay_transfer(event: Mapping[str, Any], send: Send) -> TransferVerdict:
    """Skip an upload; re-check a download through ``file_stat`` and ``sha256sum`` (see the module)."""
    step, recorded = _step(event), _result(event)
    if step.get("type") == UPLOAD:
        what = f"{recorded.get('size')} bytes, sha256 {str(recorded.get('sha256'))[:12]}…" if event.get("ok") else ""
        kept = f" ({what})" if what else ""
        return TransferVerdict(
            "skipped",
            f"an upload over HTTP{kept}: a recording keeps no uploaded bytes, so it cannot be sent again",
        )
    where = {k: step[k] for k in ("path", "path_base64") if isinstance(step.get(k), str)}
    if not where:
        return TransferVerdict("skipped", "a download whose path the recording does not hold")
    stat = send({"action": {"type": "file_stat", **where}})
    return _judge_download(event, recorded, where, stat, send)


def _judge_download(
    event: Mapping[str, Any], recorded: Mapping[str, Any], where: dict[str, str], stat: Mapping[str, Any], send: Send
) -> TransferVerdict:
    how = "re-checked with file_stat (a download is not sent again over HTTP)"
    recorded_ok, replayed_ok = bool(event.get("ok")), bool(stat.get("ok"))
    if not recorded_ok:
        theirs, mine = _code(event), _code(stat)
        same = not replayed_ok and theirs == mine
        check = Check("outcome", f"failed with {theirs}", f"failed with {mine}" if mine else "succeeded", same)
        return TransferVerdict("passed" if same else "diverged", f"{check}; {how}", (check,), replayed_ok)
    if not replayed_ok:
        check = Check("file", "there", f"failed with {_code(stat)}", False)
        return TransferVerdict("diverged", f"{check}; {how}", (check,))
    kind = str((stat.get("result") or {}).get("type"))
    kind_check = Check("type", str(recorded.get("type")), kind, kind == recorded.get("type"))
    if not kind_check.passed or kind != "file" or not recorded.get("complete") or "path" not in where:
        note = "" if kind != "directory" else " (a directory's tar is not compared byte for byte)"
        return TransferVerdict(
            "passed" if kind_check.passed else "diverged", f"{kind_check}; {how}{note}", (kind_check,), True
        )
    digest = _sha256sum(where["path"], send)
    theirs = f"{recorded.get('size')} bytes, sha256 {str(recorded.get('sha256'))[:12]}…"
    mine = f"sha256 {digest[:12]}…" if digest else "sha256sum failed"
    check = Check("sha256", theirs, mine, digest == recorded.get("sha256"))
    how = "re-checked with file_stat and sha256sum (a download is not sent again over HTTP)"
    return TransferVerdict("passed" if check.passed else "diverged", f"{check}; {how}", (kind_check, check), True)


def _sha256sum(path: str, send: Send) -> str | None:
    reply = send({"action": {"type": "exec", "argv": ["sha256sum", "-b", "--", path]}})
    result = reply.get("result") if reply.get("ok") else None
    stdout = result.get("stdout") if isinstance(result, dict) and result.get("exit_code") == 0 else None
    return stdout[:64] if isinstance(stdout, str) and len(stdout) >= 64 else None
