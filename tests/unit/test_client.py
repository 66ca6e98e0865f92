"""The protocol clients against a WebSocket server on loopback: replies matched to requests by id,
failures raised as ActionFailed, and a controller believed only once it proved the per-boot secret."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.sync.server import ServerConnection as SyncServerConnection
from websockets.sync.server import serve as sync_serve

from corral.client import BOX_FRAMES, AsyncSandboxClient, SandboxClient, check_reply, image_bytes
from corral.contracts import auth
from corral.errors import ActionFailed, CorralError, UnprovenController

SECRET = auth.new_secret()
FAILED = {"ok": False, "id": 1, "error": {"code": "unknown_key", "message": "no key 'bogus'", "field": "action.keys"}}


def test_check_reply_passes_a_success_and_raises_a_failure() -> None:
    ok = {"ok": True, "id": 1, "result": {}}
    assert check_reply(ok) is ok
    with pytest.raises(ActionFailed) as failure:
        check_reply(FAILED)
    assert (failure.value.code, failure.value.field, failure.value.error) == (
        "unknown_key",
        "action.keys",
        FAILED["error"],
    )
    assert str(failure.value) == "unknown_key: no key 'bogus' (field action.keys)"
    assert isinstance(failure.value, CorralError)
    with pytest.raises(ActionFailed) as bare:
        check_reply({"ok": False})
    assert (bare.value.code, bare.value.field) == ("", None)


def test_image_bytes_decodes_the_screenshot() -> None:
    assert image_bytes({"screenshot": {"data": base64.b64encode(b"\x89PNG").decode()}}) == b"\x89PNG"


def _answers(message: str | bytes) -> list[str]:
    """A stale reply (to a request given up on earlier) first, then the real one."""
    request = json.loads(message)
    action = request.get("action") or {}
    stale = json.dumps({"ok": True, "id": -1, "result": {"stale": True}})
    if action.get("type") == "bogus":
        return [stale, json.dumps({**FAILED, "id": request["id"]})]
    return [stale, json.dumps({"ok": True, "id": request["id"], "result": {"echo": action}})]


def _proving(proof: bool) -> Any:
    def process_response(connection: Any, request: Request, response: Response) -> Response:
        if proof:
            nonce = auth.RequestVerifier(SECRET).verify(request.headers.get(auth.AUTH_HEADER, ""))
            response.headers[auth.PROOF_HEADER] = auth.prove(SECRET, nonce)
        return response

    return process_response


@pytest.fixture
async def async_server(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    proof = getattr(request, "param", True)

    async def handler(connection: ServerConnection) -> None:
        async for message in connection:
            for answer in _answers(message):
                await connection.send(answer)

    async with serve(handler, "127.0.0.1", 0, process_response=_proving(proof)) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/ws"


@pytest.fixture
def sync_server(request: pytest.FixtureRequest) -> Iterator[str]:
    proof = getattr(request, "param", True)

    def handler(connection: SyncServerConnection) -> None:
        for message in connection:
            for answer in _answers(message):
                connection.send(answer)

    with sync_serve(handler, "127.0.0.1", 0, process_response=_proving(proof)) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}/v1/ws"
        server.shutdown()
        thread.join()


async def test_the_async_client_matches_replies_to_requests(async_server: str) -> None:
    async with AsyncSandboxClient(async_server, controller_secret=SECRET) as client:
        assert await client.request({"action": {"type": "wait"}}) == {
            "ok": True,
            "id": 1,
            "result": {"echo": {"type": "wait"}},
        }
        reply = await client.act({"type": "move", "x": 1, "y": 2}, screenshot=True)
        assert reply == {"ok": True, "id": 2, "result": {"echo": {"type": "move", "x": 1, "y": 2}}}
        with pytest.raises(ActionFailed, match="unknown_key"):
            await client.act({"type": "bogus"})
        # send_raw takes the next frame as it comes: here the stale one the server sends first.
        assert (await client.send_raw(json.dumps({"id": 9, "action": {}})))["id"] == -1


def test_the_sync_client_matches_replies_to_requests(sync_server: str) -> None:
    with SandboxClient(sync_server, controller_secret=SECRET) as client:
        assert client.request({"action": {"type": "wait"}}) == {
            "ok": True,
            "id": 1,
            "result": {"echo": {"type": "wait"}},
        }
        assert client.act({"type": "key", "keys": "a"})["id"] == 2
        with pytest.raises(ActionFailed, match="unknown_key"):
            client.act({"type": "bogus"})
        assert client.send_raw(json.dumps({"id": 9, "action": {}}))["id"] == -1


@pytest.mark.parametrize("async_server", [False], indirect=True)
async def test_the_async_client_believes_no_controller_without_its_proof(async_server: str) -> None:
    with pytest.raises(UnprovenController):
        async with AsyncSandboxClient(async_server, controller_secret=SECRET):
            raise AssertionError("connected to an unproven controller")
    async with AsyncSandboxClient(async_server) as client:  # through a gateway: the token is in the URL
        assert (await client.act({"type": "wait"}))["ok"] is True


@pytest.mark.parametrize("sync_server", [False], indirect=True)
def test_the_sync_client_believes_no_controller_without_its_proof(sync_server: str) -> None:
    with pytest.raises(UnprovenController), SandboxClient(sync_server, controller_secret=SECRET):
        raise AssertionError("connected to an unproven controller")
    with SandboxClient(sync_server) as client:
        assert client.act({"type": "wait"})["ok"] is True


def test_a_signed_connection_carries_the_signature() -> None:
    seen: list[Headers] = []

    def handler(connection: SyncServerConnection) -> None:
        assert connection.request is not None
        seen.append(connection.request.headers)

    with sync_serve(handler, "127.0.0.1", 0, process_response=_proving(True)) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        with SandboxClient(f"ws://127.0.0.1:{server.socket.getsockname()[1]}/", controller_secret=SECRET):
            pass
        server.shutdown()
        thread.join()
    assert auth.RequestVerifier(SECRET).verify(seen[0][auth.AUTH_HEADER])


# -- several requests on one connection: events sorted to their request, never taken for a reply ----------


def _event(request_id: object, data: str) -> str:
    return json.dumps({"id": request_id, "event": "output", "stream": "stdout", "data": data, "encoding": "utf-8"})


def _exec_reply(request_id: object) -> str:
    return json.dumps({"ok": True, "id": request_id, "result": {"exit_code": 0, "stdout": "ab"}})


@pytest.fixture
async def streaming_server() -> AsyncIterator[str]:
    """An ``exec`` prints "a" at once, and "b" and its reply only once a ``go`` came on the same
    connection; every other request is answered at once, meanwhile."""

    async def handler(connection: ServerConnection) -> None:
        go = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def finish(request_id: object) -> None:
            await go.wait()
            await connection.send(_event(request_id, "b"))
            await connection.send(_exec_reply(request_id))

        async for message in connection:
            request = json.loads(message)
            kind = request["action"]["type"]
            if kind == "exec":
                await connection.send(_event(request["id"], "a"))
                tasks.add(asyncio.create_task(finish(request["id"])))
                continue
            if kind == "go":
                go.set()
            await connection.send(json.dumps({"ok": True, "id": request["id"], "result": {"kind": kind}}))
        await asyncio.gather(*tasks)

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/ws"


async def test_the_async_client_sorts_events_to_their_stream_while_other_requests_go_on(
    streaming_server: str,
) -> None:
    async with AsyncSandboxClient(streaming_server) as client:
        stream = client.stream({"action": {"type": "exec", "argv": ["x"], "stream": True}})
        first = await anext(stream)
        assert first == json.loads(_event(1, "a"))
        # The command is still running: other requests on the connection are answered meanwhile.
        assert (await client.act({"type": "screenshot"}))["result"] == {"kind": "screenshot"}
        assert (await client.act({"type": "go"}))["result"] == {"kind": "go"}
        rest = [frame async for frame in stream]
        assert rest == [json.loads(_event(1, "b")), json.loads(_exec_reply(1))]
        # request() passes events over: the reply is the reply, never the first event.
        waiting = asyncio.create_task(client.request({"action": {"type": "exec", "argv": ["y"]}}))
        assert (await client.act({"type": "go"}))["ok"] is True
        reply = await waiting
        assert reply == json.loads(_exec_reply(reply["id"])) and reply["id"] in (4, 5)


def test_the_sync_client_sorts_events_to_their_stream_while_other_requests_go_on() -> None:
    go = threading.Event()

    def handler(connection: SyncServerConnection) -> None:
        workers: list[threading.Thread] = []

        def finish(request_id: object) -> None:
            go.wait(10)
            connection.send(_event(request_id, "b"))
            connection.send(_exec_reply(request_id))

        for message in connection:
            request = json.loads(message)
            kind = request["action"]["type"]
            if kind == "exec":
                connection.send(_event(request["id"], "a"))
                workers.append(threading.Thread(target=finish, args=(request["id"],)))
                workers[-1].start()
                continue
            if kind == "go":
                go.set()
            connection.send(json.dumps({"ok": True, "id": request["id"], "result": {"kind": kind}}))
        for worker in workers:
            worker.join()

    with sync_serve(handler, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        with SandboxClient(f"ws://127.0.0.1:{server.socket.getsockname()[1]}/") as client:
            stream = client.stream({"action": {"type": "exec", "argv": ["x"], "stream": True}})
            assert next(stream) == json.loads(_event(1, "a"))
            assert client.act({"type": "screenshot"})["result"] == {"kind": "screenshot"}
            assert client.act({"type": "go"})["result"] == {"kind": "go"}
            assert list(stream) == [json.loads(_event(1, "b")), json.loads(_exec_reply(1))]
            # From threads: one waits on a command whose output has not come while another is
            # answered, whichever of them happens to be reading the socket.
            go.clear()
            with ThreadPoolExecutor(2) as pool:
                waiting = pool.submit(client.request, {"action": {"type": "exec", "argv": ["y"]}})
                other = pool.submit(client.act, {"type": "screenshot"})
                assert other.result(10)["result"] == {"kind": "screenshot"}
                assert not waiting.done()
                assert client.act({"type": "go"})["ok"] is True
                assert waiting.result(10)["result"]["exit_code"] == 0
        server.shutdown()
        thread.join()


async def test_a_connection_lost_mid_stream_is_raised_to_its_waiter() -> None:
    async def handler(connection: ServerConnection) -> None:
        request = json.loads(await connection.recv())
        await connection.send(_event(request["id"], "a"))
        await connection.close()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with AsyncSandboxClient(f"ws://127.0.0.1:{port}/") as client:
            frames: list[dict[str, Any]] = []
            with pytest.raises(ConnectionClosed):
                async for frame in client.stream({"action": {"type": "exec", "argv": ["x"]}}):
                    frames.append(frame)
            assert frames == [json.loads(_event(1, "a"))]
            with pytest.raises(ConnectionClosed):
                await client.request({"action": {"type": "wait"}})


class _FloodingSocket:
    """A connection whose peer sends ``count`` output events for request 1, then its reply, as fast as
    they are read; it counts how many frames the client took off it."""

    def __init__(self, count: int) -> None:
        self.frames = [_event(1, str(n)) for n in range(count)] + [_exec_reply(1)]
        self.taken = 0
        self.sent: list[str | bytes] = []

    async def send(self, message: str | bytes) -> None:
        self.sent.append(message)

    async def __aiter__(self) -> AsyncIterator[str]:
        for frame in self.frames:
            self.taken += 1
            yield frame
        await asyncio.Event().wait()  # the connection stays open


async def _let_the_reader_run(turns: int = 50) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)  # a turn of the event loop, not a wait for time


async def test_a_slow_stream_consumer_holds_the_reader_back_instead_of_buffering_everything() -> None:
    socket = _FloodingSocket(10 * BOX_FRAMES)
    client = AsyncSandboxClient("ws://sandbox.invalid/")
    client._ws = socket  # type: ignore[assignment]
    stream = client.stream({"action": {"type": "exec", "argv": ["yes"], "stream": True}})
    reader = asyncio.create_task(client._read(socket))  # type: ignore[arg-type]
    try:
        first = await anext(stream)  # the request is sent and its box open
        await _let_the_reader_run()
        assert socket.taken <= BOX_FRAMES + 2  # the box is full: the reader waits for the consumer
        rest = [frame async for frame in stream]
        assert [first, *rest] == [json.loads(frame) for frame in socket.frames]
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_a_stream_given_up_on_frees_the_reader_for_the_others() -> None:
    socket = _FloodingSocket(10 * BOX_FRAMES)
    client = AsyncSandboxClient("ws://sandbox.invalid/")
    client._ws = socket  # type: ignore[assignment]
    stream = client.stream({"action": {"type": "exec", "argv": ["yes"], "stream": True}})
    reader = asyncio.create_task(client._read(socket))  # type: ignore[arg-type]
    try:
        await anext(stream)
        await _let_the_reader_run()
        await stream.aclose()  # its box goes, and with it what the reader waited to put there
        await _let_the_reader_run()
        assert socket.taken == len(socket.frames)  # read on to the end, dropping what nobody claims
        assert client._boxes == {}
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
