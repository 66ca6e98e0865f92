"""What a recording keeps of a file moved over HTTP (``PUT``/``GET /v1/files``): one event each.

Transfers do not go through the dispatcher, so the routes record them here, once, when they end:
an ``action`` event whose native step is ``file_upload`` or ``file_download`` (never a protocol
action: a replay knows it by that type), whose request is the route and its query, and whose result
says ``direction``, ``path``, ``size`` and ``sha256``: for an upload, the file written; for a
download, the bytes sent (a directory's: the tar stream's), and ``complete`` (false when the stream
stopped early: the client left, or the sandbox failed mid-way). The bytes themselves are never
recorded, and such an event has no frame (a transfer does not touch the screen).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterable, Callable, Mapping
from typing import Any, Literal, Self

from corral.errors import ActionError, error_body
from corral.sandbox.recorder import Recorder

Direction = Literal["upload", "download"]
ROUTE = "/v1/files"
# The query fields a native step keeps (as sent: the route's own strings).
_STEP_FIELDS = ("path", "path_base64", "make_dirs", "mode")


class Transfer:
    """One transfer on its way into the recording: what was asked and when; :meth:`done` or
    :meth:`failed` records it (once; later calls do nothing). Without a recorder it records nothing."""

    def __init__(self, recorder: Recorder | None, direction: Direction, query: Mapping[str, str]) -> None:
        self._recorder = recorder
        self._direction = direction
        self._query = dict(query)
        self._started, self._clock = time.time(), time.perf_counter()
        self._number = recorder.arrived() if recorder is not None else None
        self._recorded = False

    @classmethod
    def upload(cls, recorder: Recorder | None, query: Mapping[str, str]) -> Self:
        return cls(recorder, "upload", query)

    @classmethod
    def download(cls, recorder: Recorder | None, query: Mapping[str, str]) -> Self:
        return cls(recorder, "download", query)

    def done(self, result: Mapping[str, Any]) -> None:
        self._record({"ok": True, "result": {"direction": self._direction, **result}}, None)

    def failed(self, exc: ActionError, result: Mapping[str, Any] | None = None) -> None:
        body = error_body(exc.code, exc.message, exc.field)
        reply = {**body, "result": {"direction": self._direction, **result}} if result is not None else body
        self._record(reply, body["error"])

    def _record(self, reply: Mapping[str, Any], error: Mapping[str, Any] | None) -> None:
        if self._recorder is None or self._recorded:
            return
        self._recorded = True
        step = {"type": f"file_{self._direction}", **{k: self._query[k] for k in _STEP_FIELDS if k in self._query}}
        method = "PUT" if self._direction == "upload" else "GET"
        event = {
            "action_id": None,  # a transfer makes no request through the proxy: nothing in the audit log
            "request_seq": self._number,
            "started": self._started,
            "elapsed_ms": round((time.perf_counter() - self._clock) * 1000, 3),
            "dialect": "http",
            "request": {"http": f"{method} {ROUTE}", "query": self._query},
            "native": [step],
            "ok": reply["ok"],
            "url": None,
            "title": None,
            "error": error,
            "reply": reply,
        }
        self._recorder.record(event, frame=False)


class Tallied:
    """A download's body as it is sent, counted and hashed; ``ended(size, sha256, why_cut)`` is
    called once, when it ends (``why_cut`` None), fails or is cancelled (the client left), or is closed
    before its end."""

    def __init__(self, body: AsyncIterable[bytes], ended: Callable[[int, str, str | None], None]) -> None:
        self._body = body
        self._chunks = aiter(body)
        self._ended = ended
        self._sha256 = hashlib.sha256()
        self._size = 0
        self._over = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await anext(self._chunks)
        except StopAsyncIteration:
            self._end(None)
            raise
        except BaseException as exc:  # cancelled (the client left) or the sandbox failed: recorded as cut
            self._end(f"the stream stopped: {type(exc).__name__}")
            raise
        self._sha256.update(chunk)
        self._size += len(chunk)
        return chunk

    async def aclose(self) -> None:
        try:
            close = getattr(self._body, "aclose", None)
            if close is not None:
                await close()
        finally:
            self._end("the stream was closed before its end")

    def _end(self, why_cut: str | None) -> None:
        if not self._over:
            self._over = True
            self._ended(self._size, self._sha256.hexdigest(), why_cut)
