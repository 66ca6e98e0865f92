"""The session's recorded responses, and answering from them in a hermetic replay.

Recording: every upstream answer the proxy let through is appended to ``responses.mitm``, a
mitmproxy flow file, so a later replay can answer from it with mitmproxy's server replay. The
request is named by its vetted host (not the address it was pinned to), and its credentials
(Authorization, Cookie, ...) are blanked: replay matching never reads request headers. Bodies are
serialised on one background thread, off the proxy's event loop, in arrival order.

Replaying: :class:`Playback` is mitmproxy's ``ServerPlayback`` (its matching, its options) with one
change: the last recorded answer to a request is kept, so a replay that asks once more than the
recording did (a reload, a second favicon fetch) still gets the recorded answer, not a live one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from mitmproxy import http
from mitmproxy.addons.serverplayback import ServerPlayback
from mitmproxy.io import tnetstring

from corral.proxy.audit import is_secret_header
from corral.proxy.control import REPLAY_FILE, RESPONSES_FILE
from corral.proxy.flowfile import check

log = logging.getLogger(__name__)

__all__ = ["REPLAY_FILE", "RESPONSES_FILE", "Playback", "ResponseStore", "flow_state"]

BLANKED = b"[removed by corral]"


def flow_state(flow: http.HTTPFlow, host: str) -> dict[str, Any]:
    """What is stored of one flow: mitmproxy's own state, named by ``host``, credentials blanked."""
    state: dict[str, Any] = flow.get_state()
    state["metadata"] = {}  # the addon's notes are no flow data (and not serialisable)
    request = state["request"]
    request["host"] = host
    request["headers"] = tuple(
        (name, BLANKED if is_secret_header(name.decode("latin-1")) else value) for name, value in request["headers"]
    )
    return state


class ResponseStore:
    """Appends flows to the responses file, within a per-body and a total byte budget."""

    def __init__(self, path: Path, max_body: int, max_total: int) -> None:
        self.path = path
        self._max_body, self._max_total = max_body, max_total
        self.kept = self.skipped = self.bytes = 0  # touched on the event loop only
        self.bytes = self._resume()
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-responses")

    def offer(self, flow: http.HTTPFlow, host: str) -> bool:
        """Keep this flow if it fits; False (and counted) when it does not."""
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
        self._pool.submit(self._append, flow_state(flow, host))
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
            log.error("%s is unreadable (%s); kept as %s, starting afresh", self.path, exc, kept.name)
            os.replace(self.path, kept)
            return 0
        if complete < len(data):
            os.truncate(self.path, complete)
        return complete

    def _append(self, state: dict[str, Any]) -> None:
        data = tnetstring.dumps(state)
        with self._lock:
            before = self.path.stat().st_size if self.path.exists() else 0
            try:
                # Buffered: the whole flow is written or an error raised (a raw write may be partial).
                with self.path.open("ab") as out:
                    out.write(data)
            except OSError as exc:
                log.error("cannot keep a response in %s: %s", self.path, exc)
                with contextlib.suppress(OSError):
                    os.truncate(self.path, before)  # no torn flow for the next one to follow

    def close(self) -> None:
        self._pool.shutdown(wait=True)

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
