"""The preview tools at the SDK's seam: what each sends the gateway, what the model reads back (the
URL with its secret for people outside, the sandbox's own address for its browser), and a session
token's refusal as a tool error."""

from __future__ import annotations

import httpx
from mcp_types import TextContent

from corral.errors import error_body

from .conftest import FakeGateway, call, connect

HEX = "0123456789abcdef"
S = f"ses_{HEX}"
CREATED = {
    "id": "prv_1",
    "port": 3000,
    "host": f"3000-{HEX}.localhost",
    "url": f"http://3000-{HEX}.localhost:8701/?corral_preview_token=crl_prev_abc",
    "created_at": 1.0,
    "expires_at": 3601.0,
}
SANDBOX_URL = f"http://3000-{HEX}.localhost:8701/"


async def test_preview_port_answers_both_addresses(fake: FakeGateway) -> None:
    fake.answer = lambda request: httpx.Response(201, json=CREATED)
    async with connect(fake) as client:
        result = await call(client, "preview_port", session_id=S, port=3000, ttl_s=600)
    assert not result.is_error
    assert result.structured_content == CREATED | {"sandbox_url": SANDBOX_URL}
    text = result.content[0]
    assert isinstance(text, TextContent) and CREATED["url"] in text.text and SANDBOX_URL in text.text
    assert [(r.method, r.url.path) for r in fake.sent] == [("POST", f"/v1/sessions/{S}/previews")]
    assert fake.bodies() == [{"port": 3000, "ttl_s": 600}]


async def test_list_and_revoke_previews(fake: FakeGateway) -> None:
    row = {k: v for k, v in CREATED.items() if k != "url"} | {"revoked_at": None, "connections": 1}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(200, json={"id": "prv_1", "revoked_at": 5.0})
        return httpx.Response(200, json={"previews": [row]})

    fake.answer = answer
    async with connect(fake) as client:
        listed = await call(client, "list_previews", session_id=S)
        revoked = await call(client, "revoke_preview", session_id=S, preview_id="prv_1")
    assert listed.structured_content == {"previews": [row | {"sandbox_url": SANDBOX_URL}]}
    assert revoked.structured_content == {"id": "prv_1", "revoked_at": 5.0}
    assert [(r.method, r.url.path) for r in fake.sent] == [
        ("GET", f"/v1/sessions/{S}/previews"),
        ("DELETE", f"/v1/sessions/{S}/previews/prv_1"),
    ]


async def test_a_port_out_of_range_never_reaches_the_gateway(fake: FakeGateway) -> None:
    async with connect(fake) as client:
        for port in (0, 65536):
            result = await call(client, "preview_port", session_id=S, port=port)
            assert result.is_error
            assert result.structured_content is not None
            assert result.structured_content["error"]["code"] == "invalid_request"
    assert fake.sent == []


async def test_a_session_tokens_call_is_the_gateways_refusal_as_a_tool_error(fake: FakeGateway) -> None:
    fake.credential = "session-token"
    message = "port previews need the owner's API key"
    fake.answer = lambda request: httpx.Response(403, json=error_body("forbidden", message))
    async with connect(fake) as client:
        result = await call(client, "preview_port", session_id=S, port=3000)
    assert result.is_error
    assert result.structured_content == {"error": {"code": "forbidden", "message": message}}
    assert fake.sent[0].headers["authorization"] == "Bearer session-token"
