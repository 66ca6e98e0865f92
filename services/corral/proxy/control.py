"""The egress proxy's control channel: JSON Lines over TCP on a port of its own.

Each connection opens with ``{"op": "hello", "token": ...}``; the token says who is speaking:

- the gateway (``gateway`` role) sets the session's policy (``policy``) and reads ``status``;
- the controller inside the sandbox (``controller`` role) reports ``action`` start and end, so each
  audit record can name the agent action that caused it.

Every message with ``"ack": true`` (and every gateway message) gets one reply line,
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. Parsing is pure and raises ValueError.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any, Literal

CONTROL_PORT = 8081
# The proxy's state directory (bind-mounted from the gateway's data dir): these files, and ca/.
AUDIT_FILE = "audit.jsonl"
RESPONSES_FILE = "responses.mitm"  # upstream answers, as a mitmproxy flow file (corral.proxy.responses)
REPLAY_FILE = "replay.mitm"  # the recorded answers a hermetic session gives
POLICY_FILE = "policy.json"
MAX_LINE_BYTES = 256 * 1024
MODES = ("enforce", "report")
Role = Literal["gateway", "controller"]


@dataclass(frozen=True, slots=True)
class Hello:
    token: str


@dataclass(frozen=True, slots=True)
class SetPolicy:
    allow: tuple[str, ...]
    mode: str
    actor: str


@dataclass(frozen=True, slots=True)
class Status:
    pass


@dataclass(frozen=True, slots=True)
class ActionEvent:
    id: str
    phase: Literal["start", "end"]
    ack: bool = False


Message = Hello | SetPolicy | Status | ActionEvent


def _text(obj: dict[str, Any], key: str, max_len: int = 256) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise ValueError(f"{key!r} must be a non-empty string of at most {max_len} characters")
    return value


def parse_message(line: bytes) -> Message:
    """One line of the channel; raises ValueError naming what is wrong."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"message longer than {MAX_LINE_BYTES} bytes")
    try:
        obj = json.loads(line)
    except ValueError:
        raise ValueError("message is not JSON") from None
    if not isinstance(obj, dict):
        raise ValueError("message must be a JSON object")
    op = obj.get("op")
    if op == "hello":
        return Hello(_text(obj, "token"))
    if op == "status":
        return Status()
    if op == "policy":
        allow = obj.get("allow")
        if not isinstance(allow, list) or not all(isinstance(entry, str) for entry in allow):
            raise ValueError("'allow' must be a list of strings")
        mode = obj.get("mode", "enforce")
        if mode not in MODES:
            raise ValueError(f"'mode' must be one of {', '.join(MODES)}")
        return SetPolicy(tuple(allow), str(mode), _text(obj, "actor") if "actor" in obj else "gateway")
    if op == "action":
        phase = obj.get("phase")
        if phase not in ("start", "end"):
            raise ValueError("'phase' must be 'start' or 'end'")
        return ActionEvent(_text(obj, "id", 128), phase, bool(obj.get("ack", False)))
    raise ValueError(f"unknown op {op!r}")


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


class ControlError(Exception):
    """The proxy refused a control message or could not be reached."""


async def call(host: str, port: int, token: str, message: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """One request on a fresh connection (the gateway's way: rare, and never in the hot path)."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(encode({"op": "hello", "token": token}) + encode(message))
                await writer.drain()
                hello = json.loads(await reader.readline() or b"{}")
                if not hello.get("ok"):
                    raise ControlError(str(hello.get("error", "the proxy closed the connection")))
                reply: dict[str, Any] = json.loads(await reader.readline() or b"{}")
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError, ValueError) as exc:
        raise ControlError(f"egress proxy at {host}:{port} not reachable: {exc or type(exc).__name__}") from None
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", "the proxy refused the message")))
    return reply
