"""A stand-in controller's door for the recorder's tests: it checks the gateway's signed request and
proves the per-boot secret on its answer, as corral.sandbox.guard does in a real sandbox."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from corral.contracts import auth

SECRET = auth.new_secret()
Handler = Callable[[httpx.Request], httpx.Response]


def proving(handler: Handler, secret: str = SECRET) -> Handler:
    verifier = auth.RequestVerifier(secret)

    def answer(request: httpx.Request) -> httpx.Response:
        try:
            nonce = verifier.verify(request.headers.get(auth.AUTH_HEADER, ""))
        except ValueError:
            return httpx.Response(401, json={"ok": False})
        response = handler(request)
        response.headers[auth.PROOF_HEADER] = auth.prove(secret, nonce)
        return response

    return answer
