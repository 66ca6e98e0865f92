"""The gateway's HTTP API from the client side, over httpx's MockTransport: both clients send the
same requests and read answers and refusals alike; where the URL and the key come from."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral import gateway_client
from corral.errors import CorralError, GatewayError, error_body
from corral.gateway_client import AsyncGateway, Gateway, calls, session_body
from corral.gateway_models import TrafficRecord

INFO = {"id": "ses_1", "ws_url": "ws://gateway.invalid/v1/sessions/ses_1/ws", "container": "corral-ses-1"}
FAILED = {"ok": False, "id": 1, "error": {"code": "out_of_bounds", "message": "off the screen", "field": "action.x"}}

Handler = Callable[[httpx.Request], httpx.Response]


def _gateways(handler: Handler) -> tuple[Gateway, AsyncGateway]:
    return (
        Gateway("http://gateway.test", "key-1", transport=httpx.MockTransport(handler)),
        AsyncGateway("http://gateway.test", "key-1", transport=httpx.MockTransport(handler)),
    )


SESSION = {"id": "ses_1", "token": "tok", "allow": ["example.test"], **INFO}


@pytest.mark.parametrize(
    ("use", "method", "path", "body"),
    [
        (lambda g: g.create_session({"allow": []}), "POST", "/v1/sessions", {"allow": []}),
        (lambda g: g.session("ses_1"), "GET", "/v1/sessions/ses_1", None),
        (lambda g: g.sessions(), "GET", "/v1/sessions", None),
        (
            lambda g: g.update_session("ses_1", ["a.test"], "report"),
            "PATCH",
            "/v1/sessions/ses_1",
            {"allow": ["a.test"], "egress_mode": "report"},
        ),
        (lambda g: g.update_session("ses_1", []), "PATCH", "/v1/sessions/ses_1", {"allow": []}),
        (lambda g: g.set_timeout("ses_1", 900), "PATCH", "/v1/sessions/ses_1", {"timeout_s": 900}),
        (lambda g: g.pause_session("ses_1"), "POST", "/v1/sessions/ses_1/pause", None),
        (lambda g: g.resume_session("ses_1"), "POST", "/v1/sessions/ses_1/resume", {"secrets": {}}),
        (
            lambda g: g.resume_session("ses_1", {"API_TOKEN": "v" * 12}),
            "POST",
            "/v1/sessions/ses_1/resume",
            {"secrets": {"API_TOKEN": "v" * 12}},
        ),
        (
            lambda g: g.act("ses_1", {"action": {"type": "wait"}}),
            "POST",
            "/v1/sessions/ses_1/actions",
            {"action": {"type": "wait"}},
        ),
    ],
)
async def test_both_gateways_send_the_same_request(
    use: Callable[[Any], Any], method: str, path: str, body: dict[str, Any] | None
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/sessions" and request.method == "GET":  # a listing: a list of sessions
            return httpx.Response(200, json=[SESSION])
        return httpx.Response(200, json={"ok": True, **SESSION})

    sync, twin = _gateways(handler)
    assert use(sync) == await use(twin)
    assert len(seen) == 2
    for request in seen:
        assert (request.method, request.url.path) == (method, path)
        assert request.headers["authorization"] == "Bearer key-1"
        assert (json.loads(request.content) if request.content else None) == body


async def test_traffic_reads_json_lines_with_its_filters() -> None:
    seen: list[httpx.Request] = []
    lines = '{"seq":1,"event":"proxy"}\n\n{"seq":2,"event":"request"}\n'

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text=lines)

    sync, twin = _gateways(handler)
    expected = [TrafficRecord(seq=1, event="proxy"), TrafficRecord(seq=2, event="request")]
    assert sync.traffic("ses_1", host="a.test") == await twin.traffic("ses_1", host="a.test") == expected
    assert [(r.url.path, dict(r.url.params)) for r in seen] == [("/v1/sessions/ses_1/traffic", {"host": "a.test"})] * 2


@pytest.mark.parametrize(
    ("answer", "status", "code", "text"),
    [
        (
            {"json": error_body("not_found", "no session")},
            404,
            "not_found",
            "404 not_found: no session",
        ),
        ({"text": "boom"}, 500, "http_error", "500 http_error: boom"),
        ({"json": ["not", "an", "error"]}, 502, "http_error", '502 http_error: ["not","an","error"]'),
    ],
)
async def test_a_refusal_is_a_gateway_error(answer: dict[str, Any], status: int, code: str, text: str) -> None:
    sync, twin = _gateways(lambda request: httpx.Response(status, **answer))
    with pytest.raises(GatewayError) as sync_error:
        sync.session("ses_1")
    with pytest.raises(GatewayError) as async_error:
        await twin.session("ses_1")
    for error in (sync_error.value, async_error.value):
        assert (error.status, error.code, str(error)) == (status, code, text)
        assert isinstance(error, CorralError)


async def test_an_action_reply_is_returned_whatever_its_status_and_anything_else_is_refused() -> None:
    failure = httpx.Response(400, json=FAILED)
    assert calls.act("ses_1", {}).read(failure) == FAILED  # the sandbox's failure is a reply, not a refusal
    with pytest.raises(GatewayError, match="401 unauthorized"):
        calls.act("ses_1", {}).read(httpx.Response(401, json=error_body("unauthorized", "no")))
    for status in (404, 413, 502):  # the gateway's own refusals on /actions: its error body has ok, no id
        with pytest.raises(GatewayError, match=f"{status} sandbox_unreachable: gone"):
            calls.act("ses_1", {}).read(httpx.Response(status, json=error_body("sandbox_unreachable", "gone")))
    with pytest.raises(GatewayError, match="the gateway's answer is no reply: <html>"):
        calls.act("ses_1", {}).read(httpx.Response(200, text="<html>"))


def test_deleting_a_session_that_is_gone_can_be_fine() -> None:
    gone = httpx.Response(404, json=error_body("not_found", "no session ses_1"))
    assert calls.delete_session("ses_1", missing_ok=True).read(gone) is None
    with pytest.raises(GatewayError):
        calls.delete_session("ses_1").read(gone)
    assert calls.delete_upload("up_1").read(httpx.Response(500)) is None  # a clean-up never fails the caller


def test_session_body_has_only_what_was_given() -> None:
    assert gateway_client.session_body() == {"allow": [], "labels": {}}
    assert gateway_client.session_body(["a.test"], (800, 600), 60, 30, {"k": "v"}, "report", "up_1") == {
        "allow": ["a.test"],
        "labels": {"k": "v"},
        "viewport": {"width": 800, "height": 600},
        "timeout_s": 60,
        "idle_timeout_s": 30,
        "egress_mode": "report",
        "hermetic": "up_1",
    }
    assert gateway_client.session_body(idle_action="pause") == {"allow": [], "labels": {}, "idle_action": "pause"}


# -- where the gateway is, and the key ----------------------------------------------------------------------


def test_the_url_comes_from_the_argument_then_corral_url_then_corral_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_PORT", raising=False)
    assert gateway_client.gateway_url() == "http://127.0.0.1:8700"
    monkeypatch.setenv("CORRAL_PORT", "9000")
    assert gateway_client.gateway_url() == "http://127.0.0.1:9000"
    monkeypatch.setenv("CORRAL_URL", "http://gateway.test:1")
    assert gateway_client.gateway_url() == "http://gateway.test:1"
    assert gateway_client.gateway_url("http://other.test") == "http://other.test"


def test_the_key_comes_from_corral_api_key_then_what_is_stored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CORRAL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CORRAL_API_KEY", " , first ,second")
    assert gateway_client.api_key() == "first"  # the first of the list, as the gateway reads it
    monkeypatch.delenv("CORRAL_API_KEY")
    with pytest.raises(CorralError, match="no API key"):
        gateway_client.api_key()
    (tmp_path / "api_key").write_text("stored-key\n")
    assert gateway_client.api_key() == "stored-key"
    assert gateway_client.api_key(stored=lambda: "the compose gateway's") == "the compose gateway's"
    assert Gateway("http://gateway.test")._http.headers["authorization"] == "Bearer stored-key"


# -- a session's files, streamed from and to local files ----------------------------------------------------


async def test_both_gateways_upload_a_local_file_sized_up_front(tmp_path: Path) -> None:
    local = tmp_path / "data.bin"
    local.write_bytes(b"\x00\x01" * (gateway_client.CHUNK + 5))  # more than one chunk
    seen: list[tuple[httpx.Request, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request, request.read()))
        return httpx.Response(200, json={"ok": True, "path": "/w/d.bin", "size": 5, "sha256": "ab"})

    sync, twin = _gateways(handler)
    first = sync.upload_file("ses_1", "/w/d.bin", local, make_dirs=True, mode="0600")
    second = await twin.upload_file("ses_1", "/w/d.bin", str(local), make_dirs=True, mode="0600")
    assert first == second
    assert first.wire() == {"ok": True, "path": "/w/d.bin", "size": 5, "sha256": "ab"}
    for request, body in seen:
        assert (request.method, request.url.path) == ("PUT", "/v1/sessions/ses_1/files")
        assert dict(request.url.params) == {"path": "/w/d.bin", "make_dirs": "1", "mode": "0600"}
        assert request.headers["content-length"] == str(local.stat().st_size)
        assert request.headers["content-type"] == "application/octet-stream"
        assert body == local.read_bytes()


async def test_both_gateways_download_to_a_local_file_that_appears_only_whole(tmp_path: Path) -> None:
    data = b"\xff" * 1000

    def handler(request: httpx.Request) -> httpx.Response:
        assert dict(request.url.params) == {"path": "/w/out.tar"}
        return httpx.Response(200, content=data, headers={"content-type": "application/x-tar"})

    sync, twin = _gateways(handler)
    first = sync.download_file("ses_1", "/w/out.tar", tmp_path / "a")
    second = await twin.download_file("ses_1", "/w/out.tar", tmp_path / "b")
    assert (first.size, first.is_tar, second.size, second.is_tar) == (1000, True, 1000, True)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]  # no .part left


async def test_a_refused_download_raises_and_leaves_no_file(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json=error_body("no_such_file", "no such file: '/nope'", "path"))

    sync, twin = _gateways(handler)
    with pytest.raises(GatewayError) as refused:
        sync.download_file("ses_1", "/nope", tmp_path / "x")
    with pytest.raises(GatewayError) as async_refused:
        await twin.download_file("ses_1", "/nope", tmp_path / "x")
    for failure in (refused.value, async_refused.value):
        assert (failure.status, failure.code, failure.field) == (404, "no_such_file", "path")
    assert os.listdir(tmp_path) == []


# -- secrets ------------------------------------------------------------------------------------------------


def test_secrets_go_in_the_body_and_a_change_has_only_what_was_given() -> None:
    spec = {"value": "v" * 8, "allow": ["a.test"]}
    assert gateway_client.session_body(["a.test"], secrets={"S": spec}) == {
        "allow": ["a.test"],
        "labels": {},
        "secrets": {"S": spec},
    }
    assert gateway_client.session_body(secrets={}) == {"allow": [], "labels": {}}
    assert gateway_client.secret_change("v" * 8) == {"value": "v" * 8}
    assert gateway_client.secret_change(allow=("a.test",), in_=["query"]) == {"allow": ["a.test"], "in": ["query"]}


async def test_both_gateways_change_and_read_secrets_alike() -> None:
    seen: list[httpx.Request] = []
    placeholders = {"S": "corral_secret_" + "0" * 32}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "GET":
            return httpx.Response(200, json=placeholders)
        return httpx.Response(200, json={**SESSION, "secrets": placeholders})

    sync, twin = _gateways(handler)
    changes = {"S": {"value": "v" * 8, "allow": ["a.test"]}, "OLD": None}
    assert sync.update_secrets("ses_1", changes) == await twin.update_secrets("ses_1", changes)
    assert sync.secrets("ses_1") == await twin.secrets("ses_1") == placeholders
    assert [(r.method, r.url.path) for r in seen] == [("PATCH", "/v1/sessions/ses_1")] * 2 + [
        ("GET", "/v1/sessions/ses_1/secrets")
    ] * 2
    assert json.loads(seen[0].content) == json.loads(seen[1].content) == {"secrets": changes}


def test_env_goes_in_the_body_only_when_given() -> None:
    assert gateway_client.session_body(env={"APP_MODE": "staging"}) == {
        "allow": [],
        "labels": {},
        "env": {"APP_MODE": "staging"},
    }
    assert gateway_client.session_body(env={}) == {"allow": [], "labels": {}}


VOLUME = {"name": "work", "size_mb": 64, "used_bytes": 2048, "in_use_by": None, "created_at": 1.0}


async def test_both_gateways_make_list_get_and_delete_volumes_alike() -> None:
    seen: list[tuple[str, str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, json.loads(request.content) if request.content else None))
        if request.method == "DELETE":
            return httpx.Response(204)
        if request.url.path == "/v1/volumes" and request.method == "GET":
            return httpx.Response(200, json=[VOLUME])
        return httpx.Response(201 if request.method == "POST" else 200, json=VOLUME)

    sync, twin = _gateways(handler)
    made = sync.create_volume("work", 64)
    assert made == await twin.create_volume("work", 64) and made.used_bytes == 2048
    assert sync.volumes() == await twin.volumes() == [made]
    assert sync.volume("work") == await twin.volume("work")
    sync.delete_volume("work")
    await twin.delete_volume("work")
    assert seen == [
        ("POST", "/v1/volumes", {"name": "work", "size_mb": 64}),
        ("POST", "/v1/volumes", {"name": "work", "size_mb": 64}),
        ("GET", "/v1/volumes", None),
        ("GET", "/v1/volumes", None),
        ("GET", "/v1/volumes/work", None),
        ("GET", "/v1/volumes/work", None),
        ("DELETE", "/v1/volumes/work", None),
        ("DELETE", "/v1/volumes/work", None),
    ]
    assert session_body(volume="work") == {"allow": [], "labels": {}, "volume": "work"}
