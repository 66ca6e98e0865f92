"""``python -m corral.sandbox.controller``: serve the controller with uvicorn."""

from __future__ import annotations

import gc
import logging
import os


def main() -> None:
    # The imports make about 100,000 objects the collector tracks, nearly none of them garbage (under
    # a thousand, kept for good by the freeze): its hundred or so passes over them while they load
    # cost about 25 ms of every cold start, on CPUs Chromium is starting on (bench/cold.py). Frozen
    # once loaded, so later collections skip them too.
    gc.disable()
    try:
        import uvicorn

        from corral.contracts.limits import CDP_MAX_FRAME_BYTES
        from corral.sandbox.app import create_app
        from corral.sandbox.settings import ControllerSettings
    finally:
        gc.freeze()
        gc.enable()
    settings = ControllerSettings.from_environ(os.environ)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        ws="websockets-sansio",
        # Compressing a 170 KB screenshot frame costs about 17 ms; images do not shrink much anyway.
        ws_per_message_deflate=False,
        # CDP's frames are larger (corral.contracts.cdprules); /v1/ws keeps ws_max_frame_bytes itself.
        ws_max_size=max(settings.ws_max_frame_bytes, CDP_MAX_FRAME_BYTES),
        log_level=settings.log_level,
        access_log=False,
    )


if __name__ == "__main__":
    main()
