"""Saved browser profiles at rest: encrypted per key with the key id and name bound in, a cap that
keeps the previous version, another key's profile no profile, no key no profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import InvalidRequest, ProfileNotFound, ProfilesOff, ProfileTooLarge, ProfileUnreadable
from corral.gateway.profiles import ProfileStore, derive_key, pack_state, unpack_state
from corral.gateway.settings import GatewaySettings

OWNER, OTHER = "key-" + "a" * 24, "key-" + "b" * 24
KEY = derive_key("profile-key-Vw3nQ8zR1tY6uK0pL5sD9fG2hJ4xC7bM")


def _store(tmp_path: Path, cap: int = 1 << 20, key: bytes | None = KEY) -> ProfileStore:
    return ProfileStore(tmp_path / "profiles", key, cap)


def test_a_saved_profile_loads_back_and_is_not_plaintext_on_disk(tmp_path: Path) -> None:
    store = _store(tmp_path)
    info = store.save(OWNER, "shop", b"the state: cookie=v1")
    assert info.size == len(b"the state: cookie=v1")
    path = tmp_path / "profiles" / OWNER / "shop.profile"
    assert b"cookie=v1" not in path.read_bytes()
    assert path.stat().st_mode & 0o077 == 0
    assert store.load(OWNER, "shop") == b"the state: cookie=v1"
    assert [(p.name, p.size) for p in store.list(OWNER)] == [("shop", info.size)]
    assert store.info(OWNER, "shop").size == info.size


def test_another_key_sees_no_profile(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(OWNER, "shop", b"state")
    with pytest.raises(ProfileNotFound):
        store.load(OTHER, "shop")
    with pytest.raises(ProfileNotFound):
        store.delete(OTHER, "shop")
    assert store.list(OTHER) == []


def test_a_file_moved_to_another_key_or_name_does_not_decrypt(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(OWNER, "shop", b"state")
    sealed = (tmp_path / "profiles" / OWNER / "shop.profile").read_bytes()
    (tmp_path / "profiles" / OTHER).mkdir()
    (tmp_path / "profiles" / OTHER / "shop.profile").write_bytes(sealed)
    (tmp_path / "profiles" / OWNER / "bank.profile").write_bytes(sealed)
    with pytest.raises(ProfileUnreadable):
        store.load(OTHER, "shop")
    with pytest.raises(ProfileUnreadable):
        store.load(OWNER, "bank")
    with pytest.raises(ProfileUnreadable):
        ProfileStore(tmp_path / "profiles", derive_key("another-operator-key-0123456789abcdef"), 1 << 20).load(
            OWNER, "shop"
        )


def test_a_save_over_the_cap_keeps_the_previous_version(tmp_path: Path) -> None:
    store = _store(tmp_path, cap=10)
    store.save(OWNER, "shop", b"small")
    with pytest.raises(ProfileTooLarge, match="unchanged"):
        store.save(OWNER, "shop", b"x" * 11)
    assert store.load(OWNER, "shop") == b"small"
    assert [p.name for p in (tmp_path / "profiles" / OWNER).iterdir()] == ["shop.profile"]


def test_no_key_no_profiles(tmp_path: Path) -> None:
    store = _store(tmp_path, key=None)
    with pytest.raises(ProfilesOff, match="CORRAL_PROFILE_KEY"):
        store.save(OWNER, "shop", b"state")
    with pytest.raises(ProfilesOff):
        store.load(OWNER, "shop")


def test_names_are_checked_before_they_touch_a_path(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for name in ("../x", "a/b", "", ".hidden", "x" * 65):
        with pytest.raises(ProfileNotFound):
            store.load(OWNER, name)
    with pytest.raises(ValueError):
        store.load("../../etc", "shop")


def test_the_state_value_is_cookies_then_the_archive() -> None:
    assert unpack_state(pack_state(b"archive", b'[{"name":"a"}]')) == (b"archive", b'[{"name":"a"}]')
    with pytest.raises(ProfileUnreadable):
        unpack_state(b"something else")
    with pytest.raises(ProfileUnreadable):
        unpack_state(pack_state(b"", b"cookies")[:-3])


def test_the_key_comes_from_its_file_first_and_a_weak_one_stops_the_gateway(tmp_path: Path) -> None:
    key_file = tmp_path / "profile.key"
    key_file.write_text("file-key-" + "0123456789abcdefghijklmnopq" + "\n")
    settings = GatewaySettings(profile_key="x" * 40, profile_key_file=key_file)
    assert settings.profile_secret() == "file-key-0123456789abcdefghijklmnopq"
    assert GatewaySettings().profile_secret() is None
    with pytest.raises(InvalidRequest, match="at least 32"):
        GatewaySettings(profile_key="short").profile_secret()
    with pytest.raises(InvalidRequest, match="repetitive"):
        GatewaySettings(profile_key="ab" * 20).profile_secret()


def test_a_create_reads_its_profile_before_anything_starts(tmp_path: Path) -> None:
    from corral.gateway.models import ProfileRef
    from corral.gateway.sessions.browserprofiles import BrowserProfiles
    from corral.gateway.sessions.egressport import NullEgress

    from ..runtime.fake import FakeRuntime

    profiles = BrowserProfiles(_store(tmp_path), FakeRuntime(), NullEgress())
    assert profiles.prepare(OWNER, None) is None
    assert profiles.prepare(OWNER, ProfileRef(name="new", save=True)) is None  # made at its first save
    with pytest.raises(ProfileNotFound, match="'new'"):
        profiles.prepare(OWNER, ProfileRef(name="new"))
    profiles.store.save(OWNER, "new", b"state")
    assert profiles.prepare(OWNER, ProfileRef(name="new")) == b"state"
    off = BrowserProfiles(_store(tmp_path, key=None), FakeRuntime(), NullEgress())
    with pytest.raises(ProfilesOff):
        off.prepare(OWNER, ProfileRef(name="new", save=True))
