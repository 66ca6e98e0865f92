"""Workspace volumes: a session's cold start with a volume against one without (the same gateway,
alternating, so the machine's load falls on both alike), and how long making a volume takes.

    flock /tmp/corral-bench.lock .venv/bin/python bench/volumes.py --samples 5 [--egress]

Prints medians (and each sample) in seconds: `POST /v1/sessions` until its answer (the sandbox's
controller ready), with and without `volume`; `POST /v1/volumes` of 1 GiB; the release at the end.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from corral.gateway.server import running
from corral.gateway.settings import GatewaySettings

KEY = "bench-key-Vq7Lm3Tz9Wr5Xc2Nb8Kh4Jd6Pf"  # strong enough for the gateway to hold


def timed(client: httpx.Client, method: str, path: str, **kwargs: object) -> tuple[float, httpx.Response]:
    started = time.monotonic()
    reply = client.request(method, path, **kwargs)  # type: ignore[arg-type]
    reply.raise_for_status()
    return time.monotonic() - started, reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--egress", action="store_true", help="sessions with their egress proxy (the default gateway)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-bench-volumes-") as data:
        settings = GatewaySettings(
            port=8791,
            data_dir=Path(data),
            api_key=KEY,
            instance=f"bench-volumes-{time.time_ns()}",
            pool_size=0,
            egress=args.egress,
            record=False,
            network="corral-bench-volumes",
            egress_network="corral-bench-volumes-egress",
        )
        with (
            running(settings),
            httpx.Client(
                base_url=f"http://127.0.0.1:{settings.port}", headers={"Authorization": f"Bearer {KEY}"}, timeout=180
            ) as client,
        ):
            made = [timed(client, "POST", "/v1/volumes", json={"name": f"v{i}", "size_mb": 1024})[0] for i in range(3)]
            plain: list[float] = []
            with_volume: list[float] = []
            released: list[float] = []
            ended_plain: list[float] = []
            timed(client, "DELETE", f"/v1/sessions/{timed(client, 'POST', '/v1/sessions', json={})[1].json()['id']}")
            for _ in range(args.samples):
                for body, into in (({}, plain), ({"volume": "v0"}, with_volume)):
                    seconds, reply = timed(client, "POST", "/v1/sessions", json=body)
                    into.append(seconds)
                    ended, _ = timed(client, "DELETE", f"/v1/sessions/{reply.json()['id']}")
                    (released if body else ended_plain).append(ended)
            for i in range(3):
                timed(client, "DELETE", f"/v1/volumes/v{i}")

    def show(name: str, values: list[float]) -> None:
        samples = " ".join(f"{v:.3f}" for v in values)
        print(f"{name:<34} median {statistics.median(values):.3f} s   ({samples})")

    show("cold start, no volume", plain)
    show("cold start, with a volume", with_volume)
    show("end of a session, no volume", ended_plain)
    show("end of a session with a volume", released)
    show("POST /v1/volumes (1 GiB)", made)


if __name__ == "__main__":
    main()
