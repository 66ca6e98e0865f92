"""The egress proxy's control channel: JSON Lines over TCP on a port of its own (the messages and
answers themselves, typed and shared with the gateway and the controller: corral.contracts.control).

Each connection opens with a :class:`Hello`; its token says who is speaking:

- the gateway (``gateway`` role) sets the session's policy (:class:`SetPolicy`) and its brokered
  secrets (:class:`PutSecrets`: the whole live set each time, values included), reads the
  :class:`Status` and reports viewer links (:class:`LinkEvent`), a session's changed expiry
  (:class:`LifetimeEvent`), workspace volumes (:class:`VolumeEvent`), browser profiles
  (:class:`ProfileEvent`) and pauses and resumes (:class:`SessionEvent`), and reads the audit log and
  the recorded responses from an offset (:class:`ReadState`: the gateway's mirror where the runtime
  shares no directory with the proxy);
- the controller inside the sandbox (``controller`` role) reports action start and end
  (:class:`ActionEvent`), so each audit record can name the agent action that caused it, and
  changes of the control lease (:class:`LeaseEvent`).

Every message with ``ack`` (and every gateway message) gets one answer line, a :class:`Reply` or a
:class:`Refusal` (its ``code`` one of :class:`corral.errors.ErrorCode`'s values). Parsing is pure
and raises :class:`InvalidMessage` (a ValueError). A caller whose message is refused, or who cannot
reach the proxy, gets a :class:`ControlError`.

The gateway's answers (policy and status) carry the policy's ``generation`` (one more for each
change, kept across proxy restarts in ``policy.json``) and the audit chain's ``head`` (``seq`` and
``hash`` of the last record), which the gateway checks and anchors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from dataclasses import dataclass

import corral.contracts.control as contract
from corral.contracts.control import (
    ACTION_ID,
    CONTROL_PORT,
    LEASE_CHANGES,
    LINK_CHANGES,
    LINK_MODES,
    MAX_LINE_BYTES,
    MAX_READ_BYTES,
    MODES,
    ActionEvent,
    DownloadEvent,
    GatewayEvent,
    Hello,
    JsonObject,
    LeaseEvent,
    LifetimeEvent,
    LinkEvent,
    PreviewEvent,
    ProfileEvent,
    PutSecrets,
    ReadState,
    Refusal,
    Reply,
    Role,
    SecretEntry,
    SessionEvent,
    SetPolicy,
    Status,
    VolumeEvent,
    encode,
)
from corral.errors import ControlError, ErrorCode, InvalidMessage
from corral.proxy.secrets import Secret, secret_from

# The proxy's state directory (bind-mounted from the gateway's data dir): these files, and ca/.
AUDIT_FILE = "audit.jsonl"
RESPONSES_FILE = "responses.mitm"  # upstream answers, as a mitmproxy flow file (corral.proxy.responses)
REPLAY_FILE = "replay.mitm"  # the recorded answers a hermetic session gives
POLICY_FILE = "policy.json"

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
class SetSecrets:
    """A :class:`PutSecrets` as the proxy takes it: each secret's bindings parsed into rules, its
    value in bytes."""

    secrets: tuple[Secret, ...]
    actor: str


# What the proxy acts on: the wire's messages, with the secrets resolved.
Message = Hello | SetPolicy | Status | ActionEvent | SetSecrets | LeaseEvent | ReadState | GatewayEvent


def parse_message(line: bytes) -> Message:
    """One line of the channel; raises InvalidMessage (a ValueError) naming what is wrong."""
    message = contract.parse_message(line, InvalidMessage)
    if isinstance(message, PutSecrets):
        return SetSecrets(tuple(_resolved(entry) for entry in message.secrets), message.actor)
    return message


def _resolved(entry: SecretEntry) -> Secret:
    value = entry.value.encode() if entry.value is not None else None
    try:
        return secret_from(entry.name, entry.placeholder, value, entry.allow, entry.locations)
    except ValueError as exc:  # what the wire's checks leave to fail: a rule that does not parse
        raise InvalidMessage(INVALID_FIELD, str(exc), f"secrets.{entry.name}.allow") from None


def refusal(exc: InvalidMessage) -> Refusal:
    """The structured answer to a refused message."""
    return Refusal(str(exc), exc.code, exc.field)


def _answer(hello_line: bytes, reply_line: bytes) -> JsonObject:
    _accepted(hello_line, "the proxy closed the connection")
    return _accepted(reply_line, "the proxy refused the message")


def _accepted(line: bytes, otherwise: str) -> JsonObject:
    """The answer on ``line`` when it says ok; else a ControlError with its error and code."""
    reply: object = json.loads(line or b"{}")
    if isinstance(reply, dict) and reply.get("ok"):
        return reply
    error, code = (reply.get("error"), reply.get("code")) if isinstance(reply, dict) else (None, None)
    raise ControlError(str(error or otherwise), str(code or EGRESS_UNAVAILABLE))


def _reply(obj: JsonObject) -> Reply:
    """An accepted answer, typed; a field of the wrong kind is an InvalidMessage (a ValueError)."""
    return Reply.parse(obj, InvalidMessage)


def _unreachable(host: str, port: int, exc: Exception) -> ControlError:
    return ControlError(f"egress proxy at {host}:{port} not reachable: {exc or type(exc).__name__}")


async def call(host: str, port: int, token: str, message: contract.Message, timeout_s: float = 5.0) -> Reply:
    """One request on a fresh connection (the gateway's way: rare, and never in the hot path)."""
    try:
        async with asyncio.timeout(timeout_s):
            # A line as long as the channel allows (a ReadState's chunk), not asyncio's 64 KiB.
            reader, writer = await asyncio.open_connection(host, port, limit=MAX_LINE_BYTES + 1)
            try:
                writer.write(encode(Hello(token)) + encode(message))
                await writer.drain()
                hello = await reader.readline()
                answer = _answer(hello, await reader.readline() if hello else b"")
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError, ValueError) as exc:
        raise _unreachable(host, port, exc) from None
    return _reply(answer)  # outside: an answer of the wrong shape is the caller's to judge


def call_blocking(host: str, port: int, token: str, message: contract.Message, timeout_s: float = 5.0) -> Reply:
    """:func:`call` for code that runs in a worker thread (the gateway's teardown and its mirror):
    ``timeout_s`` bounds the whole call, as :func:`call`'s does, not each receive (a proxy that
    answers a byte at a time would hold the thread for as long as it liked)."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(encode(Hello(token)) + encode(message))
            lines = _LineReader(sock, deadline)
            hello = lines.readline()
            answer = _answer(hello, lines.readline() if hello else b"")
    except (OSError, ValueError) as exc:
        raise _unreachable(host, port, exc) from None
    return _reply(answer)


class _LineReader:
    """Lines of at most MAX_LINE_BYTES from a socket, every receive within one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._buffer = b""

    def readline(self) -> bytes:
        """The next line with its newline; at most MAX_LINE_BYTES of one without (a refusal's to
        parse); what is left at the end of the stream."""
        while (end := self._buffer.find(b"\n", 0, MAX_LINE_BYTES) + 1) == 0 and len(self._buffer) < MAX_LINE_BYTES:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the proxy did not answer in time")
            self._sock.settimeout(left)
            data = self._sock.recv(1 << 16)
            if not data:
                break
            self._buffer += data
        end = end or min(len(self._buffer), MAX_LINE_BYTES)
        line, self._buffer = self._buffer[:end], self._buffer[end:]
        return line


__all__ = [
    "ACTION_ID",
    "AUDIT_FILE",
    "CODES",
    "CONTROL_PORT",
    "EGRESS_UNAVAILABLE",
    "LEASE_CHANGES",
    "LINK_CHANGES",
    "LINK_MODES",
    "MAX_LINE_BYTES",
    "MAX_READ_BYTES",
    "MODES",
    "POLICY_FILE",
    "REPLAY_FILE",
    "RESPONSES_FILE",
    "ActionEvent",
    "DownloadEvent",
    "Hello",
    "LeaseEvent",
    "LifetimeEvent",
    "LinkEvent",
    "Message",
    "PreviewEvent",
    "ProfileEvent",
    "PutSecrets",
    "ReadState",
    "Refusal",
    "Reply",
    "Role",
    "SessionEvent",
    "SetPolicy",
    "SetSecrets",
    "Status",
    "VolumeEvent",
    "call",
    "call_blocking",
    "encode",
    "parse_message",
    "refusal",
]
