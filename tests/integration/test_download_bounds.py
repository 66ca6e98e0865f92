"""Downloads bounded by CORRAL_MAX_DOWNLOAD_BYTES, played by the agent against a real sandbox behind a
real gateway: what the agent makes with its own uid (a farm of hard links to one file, a 100 GB sparse
file, a directory of many tiny files whose tar outgrows what ``du`` counts) and takes out with its own
session token. A download over the cap is refused before a byte when its size is known, else cut at
the cap; the SDK and ``corral cp`` report ``too_large`` with the cap and leave nothing that looks
whole; a download under the cap comes whole (its sha256 matches)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.errors import GatewayError
from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway

pytestmark = pytest.mark.usefixtures("desktop_image")

MiB = 1 << 20
CAP = 8 * MiB  # the gateway's download cap here


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-dl", egress=False, max_download_bytes=CAP) as running:
        yield running


@pytest.fixture(scope="module")
def session(gw: RunningGateway) -> Iterator[dict[str, str]]:
    with gw.client() as c:
        created = c.post("/v1/sessions", json={}).json()
    yield {"id": created["id"], "token": created["token"]}
    with gw.client() as c:
        c.delete(f"/v1/sessions/{created['id']}")


@pytest.fixture(scope="module")
def sb(gw: RunningGateway, session: dict[str, str]) -> Iterator[Sandbox]:
    """The session through the SDK, with the agent's own token (never the API key)."""
    with Sandbox.attach(session["id"], session["token"], url=gw.url) as sandbox:
        yield sandbox


def _peak_rss_kib() -> int:
    """This process's peak resident size: the gateway runs in it (uvicorn in a thread)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _get(
    gw: RunningGateway, session: dict[str, str], path: str, give_up: int = 64 * MiB
) -> tuple[int, dict[str, str], int, str]:
    """A GET of ``path`` with the session's token, read as it comes (never held; left after ``give_up``
    bytes): status, headers, the bytes that came, and how it ended ("whole", "given up", or the error
    that cut it)."""
    received, ended = 0, "whole"
    headers = {"authorization": f"Bearer {session['token']}"}
    with (
        httpx.Client(base_url=gw.url, headers=headers, timeout=120) as http,
        http.stream("GET", f"/v1/sessions/{session['id']}/files", params={"path": path}) as reply,
    ):
        try:
            for chunk in reply.iter_raw(MiB):
                received += len(chunk)
                if received > give_up:
                    ended = "given up"
                    break
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            ended = type(exc).__name__
        return reply.status_code, dict(reply.headers), received, ended


def _nothing_left(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir()) if where.exists() else []


def test_a_hard_link_farm_comes_as_links_counted_once(
    gw: RunningGateway, session: dict[str, str], sb: Sandbox, tmp_path: Path
) -> None:
    # 1000 links to a 1 MiB file: 1000 MiB were each link counted (or sent) whole, over the 8 MiB cap.
    made = "mkdir -p /workspace/farm && head -c 1048576 /dev/urandom > /workspace/farm/big && cd /workspace/farm"
    links = "python3 -c \"import os; [os.link('big', f'link{i}') for i in range(1, 1001)]\""
    sb.exec(f"{made} && {links}", timeout_ms=60_000).check()
    assert sb.exec("id -u").check().stdout == "1100\n"  # made by the agent's uid
    status, headers, received, ended = _get(gw, session, "/workspace/farm")
    assert (status, ended) == (200, "whole")
    assert headers["x-corral-max-download-bytes"] == str(CAP)
    assert received < 2 * MiB  # the file once, a 512-byte header for each link
    out = sb.files.download("/workspace/farm", tmp_path / "farm")
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 1001 and {os.stat(out / name).st_ino for name in names} == {os.stat(out / "big").st_ino}
    digest = hashlib.sha256((out / "big").read_bytes()).hexdigest()
    assert sb.exec("sha256sum /workspace/farm/link77").check().stdout.split()[0] == digest


def test_a_100_gb_sparse_file_is_refused_before_a_byte_by_its_apparent_size(
    gw: RunningGateway, session: dict[str, str], sb: Sandbox
) -> None:
    sb.exec("mkdir -p /workspace/holes && truncate -s 100G /workspace/holes/huge").check()
    before = _peak_rss_kib()
    started = time.monotonic()
    for path in ("/workspace/holes/huge", "/workspace/holes"):  # the file, and the directory that holds it
        status, _, received, ended = _get(gw, session, path)
        assert (status, ended) == (413, "whole") and received < 1000, (status, ended, received)
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {session['token']}"}) as http:
            error = http.get(f"/v1/sessions/{session['id']}/files", params={"path": path}).json()["error"]
        assert error["code"] == "too_large"
        assert f"limited to {CAP} bytes (CORRAL_MAX_DOWNLOAD_BYTES)" in error["message"]
        assert "is 10737418" in error["message"]  # its apparent size (100 GiB, and the directory's), named
    assert time.monotonic() - started < 10  # refused, never streamed
    assert _peak_rss_kib() - before < 64 * 1024


def test_a_tar_that_outgrows_du_is_cut_at_the_cap_and_every_client_says_so(
    gw: RunningGateway, session: dict[str, str], sb: Sandbox, tmp_path: Path
) -> None:
    # 12000 one-byte files: du counts some 12 KB of data (and the directory), tar sends 1 KiB each
    # (a header and a padded block), some 12 MiB: past the cap only as it streams.
    made = "mkdir -p /workspace/tiny && cd /workspace/tiny && for i in $(seq 12000); do printf x > f$i; done"
    sb.exec(made, timeout_ms=120_000).check()
    before = _peak_rss_kib()
    status, headers, received, ended = _get(gw, session, "/workspace/tiny")
    assert status == 200 and headers["x-corral-max-download-bytes"] == str(CAP)
    assert (received, ended) == (CAP, "RemoteProtocolError")  # exactly the cap, then no clean end
    assert _peak_rss_kib() - before < 64 * 1024  # the gateway relays; it never holds the stream
    # The SDK: too_large with the cap, and nothing left where the directory would go.
    with pytest.raises(GatewayError) as cut:
        sb.files.download("/workspace/tiny", tmp_path / "sdk" / "tiny")
    assert (cut.value.status, cut.value.code) == (413, "too_large")
    assert f"cap of {CAP} bytes (CORRAL_MAX_DOWNLOAD_BYTES)" in str(cut.value)
    assert _nothing_left(tmp_path / "sdk") == []
    # corral cp: a clean failure naming the cap; nothing written.
    from typer.testing import CliRunner

    from corral.cli import app

    env = {"CORRAL_URL": gw.url, "CORRAL_API_KEY": KEY_A}
    (tmp_path / "cli").mkdir()
    ran = CliRunner().invoke(app, ["cp", f"{session['id']}:/workspace/tiny", str(tmp_path / "cli" / "tiny")], env=env)
    assert ran.exit_code != 0 and "too_large" in ran.output and f"cap of {CAP} bytes" in ran.output, ran.output
    assert _nothing_left(tmp_path / "cli") == []


def test_a_file_just_over_the_cap_is_refused_and_one_under_comes_whole(
    gw: RunningGateway, session: dict[str, str], sb: Sandbox, tmp_path: Path
) -> None:
    sb.exec(f"head -c {CAP + 1} /dev/urandom > /workspace/over && head -c {CAP} /dev/urandom > /workspace/under")
    with pytest.raises(GatewayError) as over:
        sb.files.download("/workspace/over", tmp_path / "sdk" / "over")
    assert (over.value.status, over.value.code) == (413, "too_large") and f"limited to {CAP} bytes" in str(over.value)
    assert _nothing_left(tmp_path / "sdk") == []
    from typer.testing import CliRunner

    from corral.cli import app

    env = {"CORRAL_URL": gw.url, "CORRAL_API_KEY": KEY_A}
    (tmp_path / "cli").mkdir()
    ran = CliRunner().invoke(app, ["cp", f"{session['id']}:/workspace/over", str(tmp_path / "cli" / "over")], env=env)
    assert ran.exit_code != 0 and "too_large" in ran.output, ran.output
    assert _nothing_left(tmp_path / "cli") == []
    under = sb.files.download("/workspace/under", tmp_path / "under")
    expected = sb.exec("sha256sum /workspace/under").check().stdout.split()[0]
    assert under.stat().st_size == CAP and hashlib.sha256(under.read_bytes()).hexdigest() == expected
    ran = CliRunner().invoke(app, ["cp", f"{session['id']}:/workspace/under", str(tmp_path / "cli" / "u")], env=env)
    assert ran.exit_code == 0 and hashlib.sha256((tmp_path / "cli" / "u").read_bytes()).hexdigest() == expected
