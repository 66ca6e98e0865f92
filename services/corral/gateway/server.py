"""``python -m corral.gateway.server``: serve the gateway with uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from corral.gateway.app import create_app
from corral.gateway.settings import GatewaySettings


def serve(settings: GatewaySettings | None = None) -> None:
    settings = settings or GatewaySettings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        ws_max_size=16 << 20,
        access_log=False,
    )


if __name__ == "__main__":
    serve()
