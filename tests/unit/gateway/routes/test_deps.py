"""Who a credential is (:func:`identify`), and the ``?token=`` of a WebSocket upgrade."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from corral.errors import Unauthorized
from corral.gateway import auth
from corral.gateway.models import CreateSession
from corral.gateway.routes.deps import identify
from corral.gateway.sessions import SessionManager

from .conftest import KEY, KEY_ID_SECRET


async def test_a_credential_is_a_key_a_live_token_or_nobody(app: FastAPI) -> None:
    manager: SessionManager = app.state.manager
    keys: auth.KeyRing = app.state.keys
    session, token = await manager.create(auth.key_id(KEY, KEY_ID_SECRET), CreateSession())
    assert identify(KEY, keys, manager) == auth.Caller(key_id=auth.key_id(KEY, KEY_ID_SECRET), presented=True)
    assert identify(token, keys, manager) == auth.Caller(session_id=session.id, presented=True)
    assert identify("nope", keys, manager) == auth.Caller(presented=True)
    assert identify(None, keys, manager) == auth.Caller()
    await manager.delete(session.id)
    assert identify(token, keys, manager) == auth.Caller(presented=True)  # a token dies with its session


def test_an_api_key_in_a_websocket_query_is_refused() -> None:
    from starlette.requests import HTTPConnection

    from corral.gateway.routes.deps import caller

    scope = {"type": "websocket", "query_string": f"token={KEY}".encode(), "headers": [], "path": "/"}
    keys = auth.KeyRing([KEY], KEY_ID_SECRET)
    with pytest.raises(Unauthorized, match="takes a session token"):
        caller(HTTPConnection(scope), keys, None)  # type: ignore[arg-type]
