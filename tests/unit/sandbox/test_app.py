"""The controller's routes that need no X server: the error body is the gateway's shape."""

from __future__ import annotations

import warnings

from corral.errors import error_body
from corral.sandbox import auth
from corral.sandbox.app import create_app
from corral.sandbox.settings import ControllerSettings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient

SECRET = auth.new_secret()


def test_a_controller_that_does_not_record_says_so_in_the_one_error_body() -> None:
    app = create_app(ControllerSettings(record=False))
    # Wired by hand as the lifespan would (it starts the desktop, which needs X).
    app.state.verifier = auth.RequestVerifier(SECRET)
    app.state.recorder = None
    signed = auth.sign(SECRET)
    reply = TestClient(app).get("/v1/recording", headers=signed.headers)
    assert reply.status_code == 404
    assert reply.json() == error_body("not_recording", "recording is off")
    assert reply.json() == {"ok": False, "error": {"code": "not_recording", "message": "recording is off"}}
    assert auth.proven(SECRET, signed.nonce, reply.headers)
