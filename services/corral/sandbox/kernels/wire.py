"""The Jupyter wire protocol (messaging spec 5.3), both ways, pure: a request signed into its
frames, a message from the kernel read and checked. The kernel is the agent's process, so what it
sends is hostile: every part is bounded, the signature is checked before anything is parsed, and a
message that is not what the spec says is refused (:class:`BadMessage`), never half-read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.errors import BadKernelMessage

DELIMITER = b"<IDS|MSG>"
PROTOCOL_VERSION = "5.3"
# The routing prefix before the delimiter: a SUB socket's topic, a ROUTER's identities (never many).
MAX_PREFIX_PARTS = 8
# One message, all its parts: a display of the largest image a reply could carry, with room.
MAX_MESSAGE_BYTES = 24 << 20
# Parts past the four JSON parts are binary buffers (widgets'); none of them is read.
MAX_PARTS = MAX_PREFIX_PARTS + 2 + 4 + 16

JsonObject = dict[str, object]


@dataclass(frozen=True, slots=True)
class Message:
    """A message from the kernel, checked: its type, the request it answers, its content."""

    msg_type: str
    msg_id: str
    parent_id: str | None  # the msg_id of the request it belongs to (None: none, e.g. a starting status)
    content: JsonObject


def new_key() -> bytes:
    """A session's HMAC key (hex, as connection files hold it): given to the kernel through its stdin."""
    return secrets.token_hex(32).encode()


def sign(key: bytes, parts: Sequence[bytes]) -> bytes:
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        digest.update(part)
    return digest.hexdigest().encode()


def request(key: bytes, session: str, msg_type: str, content: Mapping[str, object]) -> tuple[str, list[bytes]]:
    """(the new message's id, its frames after the delimiter's prefix: delimiter, signature, the four
    JSON parts) for a DEALER socket to send."""
    msg_id = secrets.token_hex(16)
    header = {
        "msg_id": msg_id,
        "session": session,
        "username": "corral",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "msg_type": msg_type,
        "version": PROTOCOL_VERSION,
    }
    parts = [_dumps(header), b"{}", b"{}", _dumps(content)]
    return msg_id, [DELIMITER, sign(key, parts), *parts]


def parse(key: bytes, frames: Sequence[bytes]) -> Message:
    """The message in ``frames`` (as a socket received them, prefix included), or BadKernelMessage:
    bounded, signed with ``key``, each JSON part an object, the header naming a type and an id."""
    if len(frames) > MAX_PARTS:
        raise BadKernelMessage(f"{len(frames)} parts; at most {MAX_PARTS}")
    if sum(len(frame) for frame in frames) > MAX_MESSAGE_BYTES:
        raise BadKernelMessage(f"over {MAX_MESSAGE_BYTES} bytes")
    try:
        at = list(frames[: MAX_PREFIX_PARTS + 1]).index(DELIMITER)
    except ValueError:
        raise BadKernelMessage("no delimiter") from None
    if len(frames) < at + 6:
        raise BadKernelMessage("fewer than the four JSON parts")
    signature, parts = frames[at + 1], list(frames[at + 2 : at + 6])
    if not hmac.compare_digest(signature, sign(key, parts)):
        raise BadKernelMessage("bad signature")
    header, parent, _metadata, content = (_object(part) for part in parts)
    msg_type, msg_id = header.get("msg_type"), header.get("msg_id")
    if not isinstance(msg_type, str) or not isinstance(msg_id, str):
        raise BadKernelMessage("a header without msg_type or msg_id")
    parent_id = parent.get("msg_id")
    return Message(msg_type, msg_id, parent_id if isinstance(parent_id, str) else None, content)


def _object(part: bytes) -> JsonObject:
    try:
        value = json.loads(part)
    except (ValueError, RecursionError):
        raise BadKernelMessage("a part that is not JSON") from None
    if not isinstance(value, dict):
        raise BadKernelMessage("a part that is not a JSON object")
    return value


def _dumps(value: Mapping[str, object]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
