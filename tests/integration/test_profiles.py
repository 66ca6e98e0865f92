"""Browser profiles against the real images and a real gateway: a cookie and a localStorage item set
on a page the fake upstream serves through the proxy, kept across sessions of one key and nobody
else's; profiles off without a key; a save over the cap refused with the old version kept; hostile
archives refused inside the sandbox; the profile's files out of the agent's reach."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import ProfileRefused, ProfileTooLarge
from corral.gateway import auth
from corral.gateway.profiles import derive_key, pack_state, seal
from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, traffic

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

PROFILE_KEY = "profile-key-Vw3nQ8zR1tY6uK0pL5sD9fG2hJ4xC7bM"
CAP_MB = 1
PAGE = "https://allowed.test/page/profile.html"
PROFILE_DIR = "/tmp/corral-browser/profile"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-profiles-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name="corral-upstream-profiles")


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
) -> Iterator[RunningGateway]:
    key_file = tmp_path_factory.mktemp("profile-key") / "profile.key"
    key_file.write_text(PROFILE_KEY + "\n")
    key_file.chmod(0o600)
    instance = f"profiles-{os.getpid()}"
    data_dir = tmp_path_factory.mktemp("profiles-gw")
    with gateway_to(upstream, data_dir, instance, profile_key_file=key_file, profile_max_mb=CAP_MB) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


def _create(gw: RunningGateway, key: str = KEY_A, **profile: object) -> Sandbox:
    return Sandbox.create(
        url=gw.url,
        api_key=key,
        allow=["allowed.test"],
        profile=profile.get("name"),  # type: ignore[arg-type]
        save_profile=bool(profile.get("save", False)),
    )


def _title(box: Sandbox, query: str = "") -> str:
    return box.navigate(PAGE + query).title


def test_a_cookie_and_local_storage_carry_over_to_the_next_session_of_the_same_key(gw: RunningGateway) -> None:
    with _create(gw, name="shop", save=True) as first:
        assert _title(first) == "cookie=none;ls=none"  # missing and save: starts empty
        assert _title(first, "?set=v1") == "cookie=v1;ls=v1"
    with gw.client() as c:
        saved = c.get("/v1/profiles/shop")
        assert saved.status_code == 200, saved.text
        assert saved.json()["size"] > 0
        assert [row["name"] for row in c.get("/v1/profiles").json()] == ["shop"]

    with _create(gw, name="shop") as second:
        assert _title(second) == "cookie=v1;ls=v1"
        loads = [r for r in traffic(gw, second.id, event="profile") if r["change"] == "loaded"]
        assert loads and loads[0]["profile"] == "shop" and loads[0]["bytes"] == saved.json()["size"]
    with _create(gw) as bare:
        assert _title(bare) == "cookie=none;ls=none"


def test_another_key_cannot_see_or_load_the_profile(gw: RunningGateway) -> None:
    with _create(gw, name="mine", save=True) as box:
        _title(box, "?set=secret")
    with gw.client(KEY_B) as c:
        assert c.get("/v1/profiles/mine").status_code == 404
        assert c.get("/v1/profiles").json() == []
        assert c.delete("/v1/profiles/mine").status_code == 404
        refused = c.post("/v1/sessions", json={"allow": ["allowed.test"], "profile": {"name": "mine"}})
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["code"] == "not_found" and "'mine'" in refused.json()["error"]["message"]
    # The same name under key B (save: made empty) holds B's own state, not A's.
    with _create(gw, KEY_B, name="mine", save=True) as other:
        assert _title(other) == "cookie=none;ls=none"


def test_a_missing_profile_without_save_is_a_404_naming_it(gw: RunningGateway) -> None:
    with gw.client() as c:
        refused = c.post("/v1/sessions", json={"profile": {"name": "nowhere"}})
        assert refused.status_code == 404
        assert "'nowhere'" in refused.json()["error"]["message"]


def test_save_now_and_a_save_over_the_cap_keeps_the_old_version(gw: RunningGateway) -> None:
    with _create(gw, name="capped", save=True) as box:
        _title(box, "?set=small")
        with gw.client() as c:
            first = c.post(f"/v1/sessions/{box.id}/profile/save")
            assert first.status_code == 200, first.text
            before = c.get("/v1/profiles/capped").json()
            assert _title(box, f"?big={2 * CAP_MB << 20}") == "cookie=small;ls=small"
            over = c.post(f"/v1/sessions/{box.id}/profile/save")
            assert over.status_code == 413, over.text
            assert over.json()["error"]["code"] == "too_large"
            assert c.get("/v1/profiles/capped").json() == before
            failed = [r for r in traffic(gw, box.id, event="profile") if r["change"] == "failed"]
            assert failed and failed[0]["profile"] == "capped"
            assert _title(box) == "cookie=small;ls=small"  # the session keeps its browser whole
    with _create(gw, name="capped") as again:
        assert _title(again) == "cookie=small;ls=small"


def test_the_session_token_cannot_save_a_profile_even_one_made_to_be_saved(gw: RunningGateway) -> None:
    """A save restarts Chromium: the agent's own token could close the pages of a person holding its
    screen. Only the owner's key saves now; ``save: true`` still saves at the end."""
    with gw.client() as c:
        made = c.post("/v1/sessions", json={"allow": ["allowed.test"], "profile": {"name": "ro", "save": True}})
        assert made.status_code == 201, made.text
        session = made.json()
        try:
            with gw.client(session["token"]) as agent:
                refused = agent.post(f"/v1/sessions/{session['id']}/profile/save")
                assert refused.status_code == 403, refused.text
                assert "owner's API key" in refused.json()["error"]["message"]
        finally:
            c.delete(f"/v1/sessions/{session['id']}")


def test_no_profile_key_no_profiles(tmp_path: Path, upstream: Upstream, runtime: DockerHarness) -> None:
    instance = f"profiles-off-{os.getpid()}"
    with gateway_to(upstream, tmp_path, instance) as off, off.client() as c:
        refused = c.post("/v1/sessions", json={"profile": {"name": "shop", "save": True}})
        assert refused.status_code == 409, refused.text
        body = refused.json()["error"]
        assert body["code"] == "profiles_off" and "CORRAL_PROFILE_KEY" in body["message"]
    runtime.remove_all({"corral.gateway": instance})


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


HOSTILE = {
    "a symbolic link": _tar((_member("Default/Cookies", tarfile.SYMTYPE, "/home/agent/x"), b"")),
    "a hard link": _tar((_member("Default/Cookies", tarfile.LNKTYPE, "/etc/passwd"), b"")),
    "a '..' path": _tar((_member("Default/Local Storage/../../../../home/agent/planted"), b"x")),
    "an absolute path": _tar((_member("/home/agent/planted"), b"x")),
    "a path outside the state": _tar((_member("Default/Preferences"), b"{}")),
    "a device": _tar((_member("Default/IndexedDB/dev", tarfile.CHRTYPE), b"")),
    "not an archive": b"\x1f\x8b not really gzip",
}


def test_hostile_archives_are_refused_inside_the_sandbox(gw: RunningGateway, runtime: DockerHarness) -> None:
    with _create(gw) as box:
        container = box.container
        for what, archive in HOSTILE.items():
            with pytest.raises(ProfileRefused):
                runtime.import_browser_state(container, archive, CAP_MB << 20)
            code, _ = runtime.exec(container, ["test", "-e", "/home/agent/planted"], user="agent")
            assert code != 0, what
        oversize = _tar((_member("Default/IndexedDB/big"), os.urandom((CAP_MB << 20) + 1)))
        with pytest.raises(ProfileTooLarge):
            runtime.import_browser_state(container, oversize, CAP_MB << 20)
        # The browser is still there and answers after each refusal.
        assert box.navigate(PAGE).title == "cookie=none;ls=none"


def test_a_hostile_saved_profile_is_refused_at_create(gw: RunningGateway) -> None:
    owner = auth.key_id(KEY_A, auth.load_key_id_key(gw.settings.data_dir))
    folder = gw.settings.data_dir / "profiles" / owner
    folder.mkdir(parents=True, exist_ok=True)
    sealed = seal(derive_key(PROFILE_KEY), owner, "evil", pack_state(HOSTILE["a symbolic link"], b""))
    (folder / "evil.profile").write_bytes(sealed)
    with gw.client() as c:
        refused = c.post("/v1/sessions", json={"allow": ["allowed.test"], "profile": {"name": "evil"}})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "profile_refused"
        # Moved to another name, a profile does not decrypt (its name is bound in).
        (folder / "renamed.profile").write_bytes(sealed)
        moved = c.post("/v1/sessions", json={"profile": {"name": "renamed"}})
        assert moved.status_code == 500 and moved.json()["error"]["code"] == "profile_unreadable"


def test_the_agent_cannot_read_the_profile_or_hold_the_browser_lock(gw: RunningGateway, runtime: DockerHarness) -> None:
    with _create(gw, name="guarded", save=True) as box:
        _title(box, "?set=v2")
        for path in (
            "/tmp/corral-browser/profile/Default/Cookies",
            "/tmp/corral-browser/profile",
            "/run/corral/browser.lock",
        ):
            code, out = runtime.exec(box.container, ["cat", path], user="agent")
            assert code != 0 and "Permission denied" in out, (path, out)
        done = box.exec(argv=["ls", "/tmp/corral-browser"])
        assert done.exit_code != 0
