"""A paused session's browser state (PausedBrowser) through the browser-profiles seam, whose export
and import stand in for the sandbox's (the real ones: tests/integration/test_pause.py): with a
profile key it is sealed on disk, 0600 in the paused session's 0700 directory, never in memory, and
bound to the session's id (a blob moved to another paused session's directory does not open); without
one it is held in memory only, nothing on disk."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from corral.errors import ProfileUnreadable
from corral.gateway.profiles import ProfileStore, derive_key
from corral.gateway.sessions.browserprofiles import BrowserProfiles
from corral.gateway.sessions.pausedbrowser import SEALED_NAME, PausedBrowser
from corral.runtime import SandboxAddress

STATE = b"corral-browser-state-v1\n cookies: session=s3cr3t-cookie-value; localStorage: token=ls-value"
MAX_BYTES = 1 << 20
FIRST, SECOND = "ses_00000000000000a1", "ses_00000000000000b2"


class SeamProfiles(BrowserProfiles):
    """The seam's two calls as the sandbox would answer them: export gives STATE, import keeps what came."""

    def __init__(self, store: ProfileStore) -> None:  # no runtime, no egress: only the seam is called
        self.store = store
        self.imported: list[tuple[str, bytes, int | None]] = []

    async def export_state(self, sandbox: SandboxAddress, max_bytes: int | None = None) -> bytes:
        return STATE

    async def import_state(self, sandbox: SandboxAddress, state: bytes, max_bytes: int | None = None) -> int:
        self.imported.append((sandbox.id, state, max_bytes))
        return len(state)


def _box(ident: str) -> SandboxAddress:
    return SandboxAddress(ident, ident, "10.99.0.2", 8765)


def _paused(tmp_path: Path, key: bytes | None) -> tuple[PausedBrowser, SeamProfiles, Path]:
    profiles = SeamProfiles(ProfileStore(tmp_path / "profiles", key, MAX_BYTES))
    root = tmp_path / "paused"
    return PausedBrowser(profiles, root, MAX_BYTES), profiles, root


async def test_with_a_key_the_state_is_sealed_0600_and_comes_back_into_the_new_sandbox(tmp_path: Path) -> None:
    browser, profiles, root = _paused(tmp_path, derive_key("profile-key-Vw3nQ8zR1tY6uK0pL5sD9fG2hJ4xC7bM"))

    assert await browser.export(FIRST, _box("old")) == len(STATE)

    sealed = root / FIRST / SEALED_NAME
    assert sealed.stat().st_mode & 0o777 == 0o600 and sealed.parent.stat().st_mode & 0o777 == 0o700
    on_disk = sealed.read_bytes()
    assert b"s3cr3t-cookie-value" not in on_disk and b"ls-value" not in on_disk  # encrypted, not just stored
    assert browser._held == {}  # nothing in memory: a restarted gateway with the same key still has it
    assert [p.name for p in (root / FIRST).iterdir()] == [SEALED_NAME]  # no temporary file left beside it

    again = PausedBrowser(profiles, root, MAX_BYTES)  # a restarted gateway, the same key
    await again.restore(FIRST, _box("new"))
    assert profiles.imported == [("new", STATE, MAX_BYTES)]

    again.discard(FIRST)
    assert not sealed.exists() and again.state(FIRST) is None


async def test_a_sealed_state_moved_to_another_session_does_not_open(tmp_path: Path) -> None:
    browser, profiles, root = _paused(tmp_path, derive_key("profile-key-Vw3nQ8zR1tY6uK0pL5sD9fG2hJ4xC7bM"))
    await browser.export(FIRST, _box("old"))
    (root / SECOND).mkdir(mode=0o700)
    shutil.copy(root / FIRST / SEALED_NAME, root / SECOND / SEALED_NAME)

    with pytest.raises(ProfileUnreadable, match="does not decrypt"):
        browser.state(SECOND)
    await browser.restore(SECOND, _box("new"))  # resumes without it: never a session that cannot resume
    assert profiles.imported == []  # nothing of the first session's browser reached the second's sandbox
    assert browser.state(FIRST) == STATE  # its own still opens

    other_key = PausedBrowser(
        SeamProfiles(ProfileStore(tmp_path / "profiles", derive_key("another-key-" + "x" * 32), MAX_BYTES)),
        root,
        MAX_BYTES,
    )
    with pytest.raises(ProfileUnreadable):
        other_key.state(FIRST)  # another CORRAL_PROFILE_KEY does not open it either


async def test_without_a_key_the_state_is_held_in_memory_only(tmp_path: Path) -> None:
    browser, profiles, root = _paused(tmp_path, None)

    assert await browser.export(FIRST, _box("old")) == len(STATE)

    assert not root.exists() or not any(root.rglob("*"))  # nothing of it on disk
    await browser.restore(FIRST, _box("new"))
    assert profiles.imported == [("new", STATE, MAX_BYTES)]
    browser.discard(FIRST)
    assert browser.state(FIRST) is None

    restarted = PausedBrowser(profiles, root, MAX_BYTES)  # lost with the memory: the resume goes on without it
    await restarted.restore(SECOND, _box("newer"))
    assert len(profiles.imported) == 1
