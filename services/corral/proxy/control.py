"""The egress proxy's control channel: JSON Lines over TCP on a port of its own.

Each connection opens with ``{"op": "hello", "token": ...}``; the token says who is speaking:

- the gateway (``gateway`` role) sets the session's policy (``policy``) and its brokered secrets
  (``secrets``: the whole live set each time, values included) and reads ``status``;
- the controller inside the sandbox (``controller`` role) reports ``action`` start and end, so each
  audit record can name the agent action that caused it.

Every message with ``"ack": true`` (and every gateway message) gets one reply line,
``{"ok": true, ...}`` or ``{"ok": false, "code": "...", "error": "...", "field": ...}`` (``code``
is one of :class:`corral.errors.ErrorCode`'s values). Parsing is pure and raises :class:`InvalidMessage` (a ValueError).
A caller whose message is refused, or who cannot reach the proxy, gets a :class:`ControlError`.

The gateway's answers (``policy`` and ``status``) carry the policy's ``generation`` (one more for
each change, kept across proxy restarts in ``policy.json``) and the audit chain's ``head``
(``seq`` and ``hash`` of the last record), which the gateway checks and anchors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from dataclasses import dataclass
from typing import Any, Literal

from corral.contracts.placeholders import (
    DEFAULT_LOCATIONS,
    LOCATIONS,
    MAX_BINDINGS,
    MAX_SECRETS,
    PLACEHOLDER,
    name_problem,
    value_problem,
)
from corral.errors import ControlError, ErrorCode, InvalidMessage
from corral.proxy.secrets import Secret, secret_from

CONTROL_PORT = 8081
# The proxy's state directory (bind-mounted from the gateway's data dir): these files, and ca/.
AUDIT_FILE = "audit.jsonl"
RESPONSES_FILE = "responses.mitm"  # upstream answers, as a mitmproxy flow file (corral.proxy.responses)
REPLAY_FILE = "replay.mitm"  # the recorded answers a hermetic session gives
POLICY_FILE = "policy.json"

# A secrets message holds up to MAX_SECRETS values of up to 4 KiB each, JSON-escaped.
MAX_LINE_BYTES = 1024 * 1024
MODES = ("enforce", "report")
Role = Literal["gateway", "controller"]
# Action ids land in every audit record, the HAR and the CLI's tables: a short token, no spaces, no
# newlines or other control characters (the controller's are ``a<n>.<boot>``).
ACTION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


# The codes of refused messages (corral.errors ships in the sidecar: it needs nothing but the stdlib).
INVALID_JSON = ErrorCode.INVALID_JSON
INVALID_REQUEST = ErrorCode.INVALID_REQUEST
INVALID_FIELD = ErrorCode.INVALID_FIELD
MESSAGE_TOO_LARGE = ErrorCode.MESSAGE_TOO_LARGE
CODES = (INVALID_JSON, INVALID_REQUEST, INVALID_FIELD, MESSAGE_TOO_LARGE)
# What the gateway answers (HTTP 503) when the proxy does not: ControlError's code when the proxy
# could not be reached or gave no code of its own.
EGRESS_UNAVAILABLE = ErrorCode.EGRESS_UNAVAILABLE


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
    # Who acted, when not the agent: ``human:<link id>`` (a viewer's input), ``cdp:<conn id>``.
    actor: str | None = None


LEASE_CHANGES = ("taken", "returned", "left", "requested", "request_ended")
LINK_CHANGES = ("created", "used", "revoked", "expired")
LINK_MODES = ("view", "control")


@dataclass(frozen=True, slots=True)
class LeaseEvent:
    """The controller's report of a change of the session's control lease (corral.sandbox.control.lease)."""

    change: str  # one of LEASE_CHANGES
    holder: str
    previous: str


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """The gateway's report of a viewer link made, used, revoked or expired (corral.gateway.links)."""

    change: str  # one of LINK_CHANGES
    link: str
    mode: str  # one of LINK_MODES
    actor: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class SetSecrets:
    """The session's whole live set of brokered secrets (names missing from it are revoked)."""

    secrets: tuple[Secret, ...]
    actor: str


Message = Hello | SetPolicy | Status | ActionEvent | SetSecrets | LeaseEvent | LinkEvent


def _text(obj: dict[str, Any], key: str, max_len: int = 256) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise InvalidMessage(INVALID_FIELD, f"{key!r} must be a non-empty string of at most {max_len} characters", key)
    return value


def parse_message(line: bytes) -> Message:
    """One line of the channel; raises InvalidMessage (a ValueError) naming what is wrong."""
    if len(line) > MAX_LINE_BYTES:
        raise InvalidMessage(MESSAGE_TOO_LARGE, f"message longer than {MAX_LINE_BYTES} bytes")
    try:
        obj = json.loads(line)
    except ValueError:
        raise InvalidMessage(INVALID_JSON, "message is not JSON") from None
    if not isinstance(obj, dict):
        raise InvalidMessage(INVALID_JSON, "message must be a JSON object")
    op = obj.get("op")
    if op == "hello":
        return Hello(_text(obj, "token"))
    if op == "status":
        return Status()
    if op == "policy":
        allow = obj.get("allow")
        if not isinstance(allow, list) or not all(isinstance(entry, str) for entry in allow):
            raise InvalidMessage(INVALID_FIELD, "'allow' must be a list of strings", "allow")
        mode = obj.get("mode", "enforce")
        if mode not in MODES:
            raise InvalidMessage(INVALID_FIELD, f"'mode' must be one of {', '.join(MODES)}", "mode")
        return SetPolicy(tuple(allow), str(mode), _text(obj, "actor") if "actor" in obj else "gateway")
    if op == "secrets":
        return SetSecrets(_secrets(obj.get("secrets")), _text(obj, "actor") if "actor" in obj else "gateway")
    if op == "action":
        phase = obj.get("phase")
        if phase not in ("start", "end"):
            raise InvalidMessage(INVALID_FIELD, "'phase' must be 'start' or 'end'", "phase")
        actor = _token(obj, "actor") if obj.get("actor") is not None else None
        return ActionEvent(_token(obj, "id"), phase, bool(obj.get("ack", False)), actor)
    if op == "lease":
        return LeaseEvent(_choice(obj, "change", LEASE_CHANGES), _token(obj, "holder"), _token(obj, "previous"))
    if op == "link":
        expires_at = obj.get("expires_at")
        if isinstance(expires_at, bool) or not isinstance(expires_at, int | float):
            raise InvalidMessage(INVALID_FIELD, "'expires_at' must be a number (unix seconds)", "expires_at")
        return LinkEvent(
            _choice(obj, "change", LINK_CHANGES),
            _token(obj, "link"),
            _choice(obj, "mode", LINK_MODES),
            _token(obj, "actor"),
            float(expires_at),
        )
    raise InvalidMessage(INVALID_REQUEST, f"unknown op {op!r}", "op")


def _token(obj: dict[str, Any], key: str) -> str:
    """An id that lands in audit records: an action id's alphabet and length."""
    value = obj.get(key)
    # fullmatch, not match: "$" would let a trailing newline through.
    if not isinstance(value, str) or ACTION_ID.fullmatch(value) is None:
        raise InvalidMessage(INVALID_FIELD, f"{key!r} must be 1 to 64 characters from A-Z a-z 0-9 _ . : -", key)
    return value


def _choice(obj: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = obj.get(key)
    if value not in choices:
        raise InvalidMessage(INVALID_FIELD, f"{key!r} must be one of {', '.join(choices)}", key)
    return str(value)


def _secrets(entries: Any) -> tuple[Secret, ...]:
    """The ``secrets`` list, every entry checked; InvalidMessage names the first bad field (never
    quoting a value)."""
    if not isinstance(entries, list) or len(entries) > MAX_SECRETS:
        raise InvalidMessage(INVALID_FIELD, f"'secrets' must be a list of at most {MAX_SECRETS} secrets", "secrets")
    parsed = [_secret(entry, index) for index, entry in enumerate(entries)]
    for attribute in ("name", "placeholder"):
        seen: set[str] = set()
        for secret in parsed:
            if getattr(secret, attribute) in seen:
                field = f"secrets.{secret.name}" + (".placeholder" if attribute == "placeholder" else "")
                raise InvalidMessage(INVALID_FIELD, f"two secrets have the same {attribute}", field)
            seen.add(getattr(secret, attribute))
    return tuple(parsed)


def _secret(entry: Any, index: int) -> Secret:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise InvalidMessage(INVALID_FIELD, "each secret is an object with a 'name'", f"secrets[{index}]")
    name: str = entry["name"]
    where = f"secrets.{name}"
    problem = name_problem(name)
    if problem is not None:
        raise InvalidMessage(INVALID_FIELD, problem, where)
    placeholder = entry.get("placeholder")
    if not isinstance(placeholder, str) or PLACEHOLDER.fullmatch(placeholder) is None:
        raise InvalidMessage(INVALID_FIELD, "a placeholder is corral_secret_ and 32 hex digits", f"{where}.placeholder")
    value = entry.get("value")  # none: the value the proxy holds stays
    if value is not None:
        problem = value_problem(value) if isinstance(value, str) else "a secret's value is a string"
        if problem is not None:
            raise InvalidMessage(INVALID_FIELD, problem, f"{where}.value")
    locations = entry.get("in", list(DEFAULT_LOCATIONS))
    if not isinstance(locations, list) or not locations or not set(locations) <= set(LOCATIONS):
        raise InvalidMessage(INVALID_FIELD, f"'in' is a non-empty list of {', '.join(LOCATIONS)}", f"{where}.in")
    allow = entry.get("allow")
    if not isinstance(allow, list) or not 0 < len(allow) <= MAX_BINDINGS or not all(isinstance(a, str) for a in allow):
        raise InvalidMessage(INVALID_FIELD, f"'allow' is a list of 1 to {MAX_BINDINGS} rules", f"{where}.allow")
    try:
        return secret_from(name, placeholder, value.encode() if value is not None else None, allow, locations)
    except ValueError as exc:  # what is left to fail: a rule that does not parse
        raise InvalidMessage(INVALID_FIELD, str(exc), f"{where}.allow") from None


def encode(obj: dict[str, Any]) -> bytes:
    # Not ASCII-escaped: a non-ASCII value takes its UTF-8 bytes (2-3), not a \uXXXX escape (6 or 12);
    # the proxy reads each line as UTF-8 JSON.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _answer(hello_line: bytes, reply_line: bytes) -> dict[str, Any]:
    _accepted(json.loads(hello_line or b"{}"), "the proxy closed the connection")
    return _accepted(json.loads(reply_line or b"{}"), "the proxy refused the message")


def _accepted(reply: Any, otherwise: str) -> dict[str, Any]:
    """``reply`` when it says ok; else a ControlError with its error and code."""
    if isinstance(reply, dict) and reply.get("ok"):
        return reply
    error, code = (reply.get("error"), reply.get("code")) if isinstance(reply, dict) else (None, None)
    raise ControlError(str(error or otherwise), str(code or EGRESS_UNAVAILABLE))


async def call(host: str, port: int, token: str, message: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """One request on a fresh connection (the gateway's way: rare, and never in the hot path)."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(encode({"op": "hello", "token": token}) + encode(message))
                await writer.drain()
                hello = await reader.readline()
                return _answer(hello, await reader.readline() if hello else b"")
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError, ValueError) as exc:
        raise ControlError(f"egress proxy at {host}:{port} not reachable: {exc or type(exc).__name__}") from None


def call_blocking(host: str, port: int, token: str, message: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """:func:`call` for code that runs in a worker thread (the gateway's teardown)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(encode({"op": "hello", "token": token}) + encode(message))
            with sock.makefile("rb") as lines:
                hello = lines.readline(MAX_LINE_BYTES)
                return _answer(hello, lines.readline(MAX_LINE_BYTES) if hello else b"")
    except (OSError, ValueError) as exc:
        raise ControlError(f"egress proxy at {host}:{port} not reachable: {exc or type(exc).__name__}") from None
