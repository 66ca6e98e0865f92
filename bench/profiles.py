"""Browser profiles, measured: the time a profile save takes (a session with a cookie and a
localStorage item set on the fake upstream's page), the sealed profile's size, and a create with
that profile against a create without one on the same gateway, alternated so both meet the same
load; medians over the rounds. Budget: a save's median under 15 s.

    flock /tmp/corral-bench.lock .venv/bin/python bench/profiles.py --rounds 3

Moved here from tests/integration/test_profiles.py (test_measure_profile_load_and_save), which
only measured: speed lives in bench/, the integration tests check behaviour (docs/design/0375).
Needs the images built (`corral images build`); the fake upstream runs on a network of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from corral.sdk import Sandbox

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.integration.dockerutil import DockerHarness
from tests.integration.egress_fixtures import gateway_to, start_upstream
from tests.integration.gateway_fixtures import KEY_A, RunningGateway

PROFILE_KEY = "bench-profile-key-Vw3nQ8zR1tY6uK0pL5sD9fG2hJ4x"
PAGE = "https://allowed.test/page/profile.html?set=b"
SAVE_BUDGET_S = 15.0  # a save's median


def measure(gw: RunningGateway, rounds: int) -> dict[str, list[float]]:
    """``rounds`` saves of one session's profile, then ``rounds`` creates with it and without, alternated."""
    saves: list[float] = []
    sizes: list[float] = []
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"], profile="bench", save_profile=True) as box:
        box.navigate(PAGE)
        with gw.client() as c:
            for _ in range(rounds):
                started = time.monotonic()
                answer = c.post(f"/v1/sessions/{box.id}/profile/save")
                saves.append(time.monotonic() - started)
                assert answer.status_code == 200, answer.text
                sizes.append(float(answer.json()["size"]))
    loads: list[float] = []
    bare: list[float] = []
    with gw.client() as c:
        for _ in range(rounds):
            for body, into in (({"profile": {"name": "bench"}}, loads), ({}, bare)):
                started = time.monotonic()
                made = c.post("/v1/sessions", json={"allow": ["allowed.test"], **body})
                into.append(time.monotonic() - started)
                assert made.status_code == 201, made.text
                c.delete(f"/v1/sessions/{made.json()['id']}")
    return {"save_s": saves, "size_b": sizes, "create_with_profile_s": loads, "create_without_s": bare}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the samples and medians here")
    args = parser.parse_args()
    runtime = DockerHarness()
    instance = f"bench-profiles-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="corral-bench-profiles-") as work:
        root = Path(work)
        key_file = root / "profile.key"
        key_file.write_text(PROFILE_KEY + "\n")
        key_file.chmod(0o600)
        (root / "upstream").mkdir()
        (root / "gw").mkdir()
        # The upstream and its network go when the block ends (start_upstream's own cleanup).
        with contextmanager(start_upstream)(
            runtime, root / "upstream", instance, name="corral-bench-profiles-upstream"
        ) as upstream:
            try:
                with gateway_to(upstream, root / "gw", instance, profile_key_file=key_file) as gw:
                    samples = measure(gw, args.rounds)
            finally:
                runtime.remove_all({"corral.gateway": instance})
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"medians over {args.rounds} rounds:")
    for name, value in medians.items():
        print(f"  {name:22} {value:10.2f}")
    ok = medians["save_s"] < SAVE_BUDGET_S
    print(f"  budget: save median < {SAVE_BUDGET_S:.0f} s: {'met' if ok else 'MISSED'}")
    if args.json is not None:
        args.json.write_text(json.dumps({"samples": samples, "medians": medians}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
