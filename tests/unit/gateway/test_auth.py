from __future__ import annotations

import stat
from pathlib import Path

from corral.gateway import auth


def test_keyring_accepts_only_its_keys() -> None:
    ring = auth.KeyRing(["alpha", "beta"])
    assert ring.check("alpha") == auth.key_id("alpha")
    assert ring.check("beta") == auth.key_id("beta")
    assert ring.check("alph") is None
    assert ring.check("") is None
    assert auth.key_id("alpha") != auth.key_id("beta")
    assert "alpha" not in auth.key_id("alpha")  # the id does not reveal the key


def test_token_matches_its_digest_only() -> None:
    token = auth.new_token()
    assert len(token) >= 40
    assert auth.token_matches(token, auth.digest(token))
    assert not auth.token_matches(token + "x", auth.digest(token))
    assert auth.new_token() != token


def test_generated_key_is_kept_and_private(tmp_path: Path) -> None:
    key = auth.load_or_create_key(tmp_path / "data")
    assert key.startswith("crl_") and len(key) > 30
    path = tmp_path / "data" / auth.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.load_or_create_key(tmp_path / "data") == key  # the same key on the next start
