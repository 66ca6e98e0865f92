"""The downloads watch ends when closed, whatever its CDP connection is doing: a controller's shutdown
waits on it, and a controller that never finishes shutting down is never started again by the init
(docs/design/0475)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from corral.sandbox.web.downloadbook import DownloadBook
from corral.sandbox.web.downloadwatch import DownloadWatch

CLOSE_BOUND_S = 5.0  # far above a close's few milliseconds; only a hang reaches it


class _Socket:
    """The watch's end of its CDP connection: what it sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    async def send(self, frame: str) -> None:
        self.sent.append(json.loads(frame))


async def test_a_cancel_that_lands_with_the_answer_ends_the_call() -> None:
    """The race that hung a controller: its shutdown cancels the watch in the same turn of the loop in
    which Chromium's answer to the watch's call is read. asyncio.wait_for (before Python 3.12) then
    returned the answer and dropped the cancellation, and the watch followed on for ever."""
    watch = DownloadWatch("http://127.0.0.1:9", DownloadBook(), None, None)
    ws = _Socket()
    call = asyncio.create_task(watch._call(ws, "Browser.setDownloadBehavior", {}))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # its first step: the call sent, its answer awaited
    (waiting,) = watch._calls.values()
    waiting.set_result({"id": 1, "result": {}})  # the reader hands the answer over...
    call.cancel()  # ...as the shutdown cancels
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not watch._calls


async def test_an_unanswered_call_ends_with_an_error_answer() -> None:
    watch = DownloadWatch("http://127.0.0.1:9", DownloadBook(), None, None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("corral.sandbox.web.downloadwatch._CALL_TIMEOUT_S", 0.05)
        answer = await watch._call(_Socket(), "Browser.setDownloadBehavior", {})  # type: ignore[arg-type]
    assert answer == {"error": {"message": "Browser.setDownloadBehavior got no answer"}}
    assert not watch._calls


@asynccontextmanager
async def _devtools(answers: Callable[[dict[str, object]], bool], called: asyncio.Event) -> AsyncIterator[str]:
    """A DevTools endpoint on loopback: ``/json/version`` names its browser socket, which answers the
    calls ``answers`` says to (and never the others), ``called`` set at each. Yields its ``http://``
    address."""
    address: list[str] = []

    def version(_conn: ServerConnection, request: Request) -> Response | None:
        if request.path != "/json/version":
            return None
        body = json.dumps({"webSocketDebuggerUrl": f"ws://{address[0]}/devtools/browser/fake"}).encode()
        headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return Response(HTTPStatus.OK.value, "OK", headers, body)

    async def browser(conn: ServerConnection) -> None:
        async for frame in conn:
            call = json.loads(frame)
            called.set()
            if answers(call):
                await conn.send(json.dumps({"id": call["id"], "result": {}}))

    async with serve(browser, "127.0.0.1", 0, process_request=version) as server:
        host, port = next(iter(server.sockets)).getsockname()[:2]
        address.append(f"{host}:{port}")
        yield f"http://{host}:{port}"


async def test_closing_a_watch_that_follows_chromium_ends_it() -> None:
    async with _devtools(lambda _call: True, asyncio.Event()) as url:
        watch = DownloadWatch(url, DownloadBook(), None, None, retry_s=0.05)
        watch.start()
        async with asyncio.timeout(CLOSE_BOUND_S):
            await watch.watching.wait()
        async with asyncio.timeout(CLOSE_BOUND_S):
            await watch.close()
    assert watch._task is not None and watch._task.cancelled()


async def test_closing_a_watch_whose_call_is_unanswered_ends_it() -> None:
    called = asyncio.Event()
    async with _devtools(lambda _call: False, called) as url:
        watch = DownloadWatch(url, DownloadBook(), None, None, retry_s=0.05)
        watch.start()
        async with asyncio.timeout(CLOSE_BOUND_S):
            await called.wait()
        assert watch._calls
        async with asyncio.timeout(CLOSE_BOUND_S):
            await watch.close()
    assert watch._task is not None and watch._task.cancelled()
    assert not watch._calls
