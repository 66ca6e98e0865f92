"""The session's recorded responses, and answering from them in a hermetic replay.

Recording: every upstream answer the proxy let through is appended to ``responses.mitm``, a
mitmproxy flow file, so a later replay can answer from it with mitmproxy's server replay. The
request is named by its vetted host (not the address it was pinned to), and its credentials
(Authorization, Cookie, ...) are blanked: replay matching never reads request headers. A request a
person's input caused (its action's actor is ``human:...``: a login form's post) keeps no body
either: what a person typed never enters a recording (docs/recording.md). Bodies are
encoded without re-serialising their connections, into one buffered file flushed every second.

Replaying: :class:`Playback` is mitmproxy's ``ServerPlayback`` (its matching, its options) with one
change: the last recorded answer to a request is kept, so a replay that asks once more than the
recording did (a reload, a second favicon fetch) still gets the recorded answer, not a live one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO, TypedDict

from mitmproxy import connection, http
from mitmproxy.addons.serverplayback import ServerPlayback
from mitmproxy.io import tnetstring
from mitmproxy.version import FLOW_FORMAT_VERSION

from corral.proxy.audit import is_secret_header
from corral.proxy.control import REPLAY_FILE, RESPONSES_FILE
from corral.proxy.flowfile import check

log = logging.getLogger(__name__)

__all__ = ["REPLAY_FILE", "RESPONSES_FILE", "Playback", "ResponseStore", "encode_flow", "flow_fields"]

BLANKED = b"[removed by corral]"


MAX_CONNECTIONS = 256  # connections whose serialised state is kept for their next flows
BUFFER_BYTES = 256 << 10
FLUSH_EVERY_S = 1.0


# The fields every kept flow has alike, encoded once.
_CONSTANT_FIELDS = b"".join(
    tnetstring.dumps(key) + tnetstring.dumps(value)
    for key, value in (
        ("version", FLOW_FORMAT_VERSION),
        ("type", "http"),
        ("error", None),
        ("intercepted", False),
        ("is_replay", None),
        ("marked", ""),
        ("metadata", {}),  # the addon's notes are no flow data
        ("comment", ""),
        ("backup", None),
        ("websocket", None),
    )
)


class FlowFields(TypedDict):
    """What differs from flow to flow in a kept flow (:func:`flow_fields`); ``request`` and ``response``
    are mitmproxy's own state of each (``get_state()``: its serialisation, open-ended to Corral)."""

    id: str
    timestamp_created: float
    request: dict[str, Any]
    response: dict[str, Any] | None


def flow_fields(flow: http.HTTPFlow, host: str, by_person: bool = False) -> FlowFields:
    """The parts of mitmproxy's state that differ from flow to flow (its connections aside), the
    request named by ``host`` and its credentials blanked (and its body, ``by_person``: a person's
    input caused it).

    Field by field: ``flow.get_state()`` would serialise both connections (certificates and all)
    anew for every request, most of the cost of keeping a response."""
    request = flow.request.get_state()  # type: ignore[no-untyped-call,unused-ignore]
    request["host"] = host
    if by_person and request.get("content"):
        request["content"] = BLANKED
    request["headers"] = tuple(
        (name, BLANKED if is_secret_header(name.decode("latin-1")) else value) for name, value in request["headers"]
    )
    response = flow.response.get_state() if flow.response is not None else None  # type: ignore[no-untyped-call,unused-ignore]
    return {"id": flow.id, "timestamp_created": flow.timestamp_created, "request": request, "response": response}


def connection_state(conn: connection.Connection) -> bytes:
    """A connection's state as a tnetstring, without its certificates (a replay needs none)."""
    state = conn.get_state()  # mitmproxy's serialisation of it
    state["certificate_list"] = []
    return bytes(tnetstring.dumps(state))


def encode_flow(fields: FlowFields, client: bytes, server: bytes) -> bytes:
    """One flow as mitmproxy's flow files hold it: a tnetstring dictionary of its whole state."""
    items = [_CONSTANT_FIELDS]
    items += [
        tnetstring.dumps("id") + tnetstring.dumps(fields["id"]),
        tnetstring.dumps("timestamp_created") + tnetstring.dumps(fields["timestamp_created"]),
        tnetstring.dumps("request") + tnetstring.dumps(fields["request"]),
        tnetstring.dumps("response") + tnetstring.dumps(fields["response"]),
    ]
    items += [tnetstring.dumps("client_conn") + client, tnetstring.dumps("server_conn") + server]
    body = b"".join(items)
    return b"%d:%s}" % (len(body), body)


class ResponseStore:
    """Appends flows to the responses file, within a per-body and a total byte budget."""

    def __init__(self, path: Path, max_body: int, max_total: int) -> None:
        self.path = path
        self._max_body, self._max_total = max_body, max_total
        self.kept = self.skipped = 0
        self.bytes = self._resume()
        self._connections: OrderedDict[tuple[str, str], tuple[bytes, bytes]] = OrderedDict()
        # One open, buffered file: a flow costs an encode and a memory copy on the event loop (a
        # thread, or a file opened per flow, cost a third of the proxy's requests/s when measured).
        self._out: BinaryIO | None = self.path.open("ab", buffering=BUFFER_BYTES)
        self._flushed = time.monotonic()
        self._flush_later: asyncio.TimerHandle | None = None

    def offer(self, flow: http.HTTPFlow, host: str, by_person: bool = False) -> bool:
        """Keep this flow if it fits; False (and counted) when it does not. ``by_person``: a person's
        input caused it, so its request body is not kept."""
        response = flow.response
        if response is None or response.raw_content is None or flow.websocket is not None:
            self.skipped += 1  # streamed bodies and WebSockets cannot be replayed
            return False
        size = len(flow.request.raw_content or b"") + len(response.raw_content)
        if size > self._max_body or self.bytes + size > self._max_total:
            self.skipped += 1
            return False
        self.kept += 1
        self.bytes += size
        key = (flow.client_conn.id, flow.server_conn.id)
        connections = self._connections.get(key)
        if connections is None:
            connections = connection_state(flow.client_conn), connection_state(flow.server_conn)
            self._connections[key] = connections
            if len(self._connections) > MAX_CONNECTIONS:
                self._connections.popitem(last=False)
        self._append(encode_flow(flow_fields(flow, host, by_person), *connections))
        return True

    def _resume(self) -> int:
        """A restarted proxy carries on after the last whole flow (a killed one may have torn it)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        try:
            complete = check(data).complete
        except ValueError as exc:
            kept = self.path.with_suffix(f".unreadable-{int(time.time())}")
            # A warning: an error logged at startup makes mitmdump exit.
            log.warning("%s is unreadable (%s); kept as %s, starting afresh", self.path, exc, kept.name)
            os.replace(self.path, kept)
            return 0
        if complete < len(data):
            os.truncate(self.path, complete)
        return complete

    def _append(self, data: bytes) -> None:
        if self._out is None:
            return
        try:
            self._out.write(data)
            if time.monotonic() - self._flushed >= FLUSH_EVERY_S:
                self._flush()
            else:
                self._schedule_flush()  # a quiet session's last flows are not left in the buffer
        except OSError as exc:
            # Kept no further: a torn flow stays the last one, which every reader leaves out.
            log.error("cannot keep responses in %s: %s; keeping no more", self.path, exc)
            with contextlib.suppress(OSError):
                self._out.close()
            self._out = None

    def _schedule_flush(self) -> None:
        if self._flush_later is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on an event loop (tests): flushed at the next write or at close
        self._flush_later = loop.call_later(FLUSH_EVERY_S, self._flush)

    def flush(self) -> None:
        """What is buffered written out now (before the gateway reads the file through the channel)."""
        self._flush()

    def _flush(self) -> None:
        """What a killed proxy loses: at most the last second's flows."""
        if self._flush_later is not None:
            self._flush_later.cancel()
            self._flush_later = None
        self._flushed = time.monotonic()
        if self._out is not None:
            try:
                self._out.flush()
            except OSError as exc:
                log.error("cannot keep responses in %s: %s; keeping no more", self.path, exc)
                with contextlib.suppress(OSError):
                    self._out.close()
                self._out = None

    def close(self) -> None:
        if self._flush_later is not None:
            self._flush_later.cancel()
            self._flush_later = None
        if self._out is not None:
            with contextlib.suppress(OSError):
                self._out.close()
            self._out = None

    def counts(self) -> dict[str, int]:
        return {"kept": self.kept, "skipped": self.skipped, "bytes": self.bytes}


class Playback(ServerPlayback):  # type: ignore[misc,unused-ignore]  # Any where mitmproxy is absent
    """Server replay that keeps each request's last recorded answer instead of running out of it.

    Used as a component of the egress addon (not registered as an addon itself), so policy is
    decided before any recorded answer is given; the ``server_replay_*`` matching options are the
    ones mitmproxy's own ``ServerPlayback`` declares.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call,unused-ignore]

    def next_flow(self, flow: http.HTTPFlow) -> http.HTTPFlow | None:
        candidates = self.flowmap.get(self._hash(flow))
        if not candidates:
            return None
        return candidates.pop(0) if len(candidates) > 1 else candidates[0]

    def add_recorded(self, flows: list[http.HTTPFlow]) -> int:
        """Only flows with an answer; returns how many."""
        answered = [f for f in flows if f.response is not None]
        self.load_flows(answered)
        return len(answered)
