"""``sb.previews`` and ``sb.get_host``: the requests both twins send through the gateway clients (over
httpx's mock transport, the one seam) and how the gateway's answers are read."""

from __future__ import annotations

import json

import httpx
import pytest

from corral.errors import ErrorCode, GatewayError, InvalidRequest, error_body
from corral.gateway_client import AsyncGateway, Gateway
from corral.gateway_models import Preview, PreviewInfo, sandbox_url
from corral.sdk import AsyncSandbox, Sandbox
from corral.sdk.previews import preview_host

HEX = "0123456789abcdef"
SESSION = f"ses_{HEX}"
CREATED = {
    "id": "prv_1",
    "port": 3000,
    "host": f"3000-{HEX}.localhost",
    "url": f"http://3000-{HEX}.localhost:8701/?corral_preview=crl_prev_abc",
    "created_at": 1.0,
    "expires_at": 3601.0,
}
LISTED = {
    "previews": [
        {
            "id": "prv_1",
            "port": 3000,
            "host": f"3000-{HEX}.localhost",
            "created_at": 1.0,
            "expires_at": 3601.0,
            "revoked_at": None,
            "last_used_at": 5.0,
            "connections": 2,
            "bytes_in": 100,
            "bytes_out": 2000,
            "newer_field": "kept",
        }
    ]
}


def _handler(seen: list[httpx.Request]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            return httpx.Response(201, json=CREATED)
        if request.method == "DELETE":
            return httpx.Response(200, json={"id": "prv_1", "revoked_at": 9.0})
        return httpx.Response(200, json=LISTED)

    return httpx.MockTransport(answer)


def _twins(seen: list[httpx.Request]) -> tuple[Sandbox, AsyncSandbox]:
    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox.id = twin.id = SESSION
    sandbox._gateway = Gateway("http://gateway.test", "key", transport=_handler(seen))
    twin._gateway = AsyncGateway("http://gateway.test", "key", transport=_handler(seen))
    return sandbox, twin


async def test_both_twins_create_list_and_revoke_with_the_same_requests() -> None:
    seen: list[httpx.Request] = []
    sandbox, twin = _twins(seen)
    made = sandbox.previews.create(3000, ttl_s=600)
    assert made == await twin.previews.create(3000, ttl_s=600)
    assert isinstance(made, Preview) and made.url.endswith("crl_prev_abc") and made.expires_at == 3601.0
    assert made.sandbox_url == f"http://3000-{HEX}.localhost:8701/"
    listed = sandbox.previews.list()
    assert listed == await twin.previews.list()
    assert [type(row) for row in listed] == [PreviewInfo] and listed[0].connections == 2
    assert listed[0].model_extra == {"newer_field": "kept"}  # what a newer gateway adds is kept
    assert "url" not in listed[0].wire()  # a listing never carries the secret
    revoked = sandbox.previews.revoke("prv_1")
    assert revoked == await twin.previews.revoke("prv_1") and revoked.revoked_at == 9.0
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", f"/v1/sessions/{SESSION}/previews"),
        ("POST", f"/v1/sessions/{SESSION}/previews"),
        ("GET", f"/v1/sessions/{SESSION}/previews"),
        ("GET", f"/v1/sessions/{SESSION}/previews"),
        ("DELETE", f"/v1/sessions/{SESSION}/previews/prv_1"),
        ("DELETE", f"/v1/sessions/{SESSION}/previews/prv_1"),
    ]
    assert json.loads(seen[0].content) == json.loads(seen[1].content) == {"port": 3000, "ttl_s": 600}
    assert all(r.headers["authorization"] == "Bearer key" for r in seen)


async def test_a_create_without_ttl_leaves_the_gateways_default() -> None:
    seen: list[httpx.Request] = []
    sandbox, twin = _twins(seen)
    sandbox.previews.create(8080)
    await twin.previews.create(8080)
    assert [json.loads(r.content) for r in seen] == [{"port": 8080}, {"port": 8080}]


@pytest.mark.parametrize("port", [0, 65536, -1, True, "3000"])
async def test_a_port_out_of_range_is_refused_before_any_request(port: object) -> None:
    seen: list[httpx.Request] = []
    sandbox, twin = _twins(seen)
    with pytest.raises(InvalidRequest) as caught:
        sandbox.previews.create(port)  # type: ignore[arg-type]
    assert caught.value.code == ErrorCode.INVALID_REQUEST and caught.value.field == "port"
    with pytest.raises(InvalidRequest):
        await twin.previews.create(port)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        sandbox.get_host(port)  # type: ignore[arg-type]
    assert seen == []


async def test_a_refusal_keeps_the_gateways_code_and_message() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(403, json=error_body("forbidden", "previews need the owner's API key"))

    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox.id = twin.id = SESSION
    sandbox._gateway = Gateway("http://gateway.test", "tok", transport=httpx.MockTransport(refuse))
    twin._gateway = AsyncGateway("http://gateway.test", "tok", transport=httpx.MockTransport(refuse))
    with pytest.raises(GatewayError) as caught:
        sandbox.previews.create(3000)
    assert caught.value.status == 403 and caught.value.code == "forbidden"
    assert "owner's API key" in str(caught.value)
    with pytest.raises(GatewayError):
        await twin.previews.list()


def test_get_host_names_the_previews_host_as_e2b_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_PREVIEW_DOMAIN", raising=False)
    sandbox = Sandbox.__new__(Sandbox)
    sandbox.id = SESSION
    assert sandbox.get_host(3000) == f"3000-{HEX}.localhost" == CREATED["host"]
    monkeypatch.setenv("CORRAL_PREVIEW_DOMAIN", "Previews.Example.test.")
    assert sandbox.get_host(5173) == f"5173-{HEX}.previews.example.test"
    assert preview_host(SESSION, 1, "a.test") == f"1-{HEX}.a.test"


def test_the_sandbox_url_is_the_same_preview_on_the_sandboxs_loopback() -> None:
    assert sandbox_url(f"3000-{HEX}.previews.example.test") == f"http://3000-{HEX}.localhost:8701/"
    assert sandbox_url(f"3000-{HEX}.localhost:8701") == f"http://3000-{HEX}.localhost:8701/"
