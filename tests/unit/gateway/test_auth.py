from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.errors import CodedError, Forbidden, KeyIdKeyUnusable, NotFound, SessionNotFound, Unauthorized
from corral.gateway import auth
from corral.gateway.settings import GatewaySettings

SECRET = bytes(range(32))
STRONG_A = "alpha-Qm3Zr8Tx5Vw2Ny7Kb4Hc9Pd6Lf0"
STRONG_B = "beta-Zt5Wq8Rm2Xn7Lc4Vj9Hs3Gd6Pf1y"


def test_keyring_accepts_only_its_keys() -> None:
    ring = auth.KeyRing(["alpha", "beta"], SECRET)
    assert ring.check("alpha") == auth.key_id("alpha", SECRET)
    assert ring.check("beta") == auth.key_id("beta", SECRET)
    assert ring.check("alph") is None
    assert ring.check("") is None
    assert auth.key_id("alpha", SECRET) != auth.key_id("beta", SECRET)
    assert "alpha" not in auth.key_id("alpha", SECRET)  # the id does not reveal the key


def test_a_key_id_cannot_be_computed_from_the_key_without_the_gateways_secret() -> None:
    """The attack: an id seen in a record, and a guess of the key. The old id was the guess's
    unsalted SHA-256; the new one needs the secret, and another secret gives another id."""
    seen = auth.key_id("hunter2", SECRET)
    assert seen != auth.legacy_key_id("hunter2")  # the old public function no longer finds it
    assert seen != "key-" + auth.digest("hunter2")[:24]
    assert seen != auth.key_id("hunter2", bytes(32))  # nor does any other secret
    assert len(seen) == len("key-") + 24 and seen == auth.key_id("hunter2", SECRET)  # stable under one secret
    assert auth.legacy_key_id("hunter2") == "key-f52fbd32b2b3"  # what an older gateway wrote


def test_key_ids_stay_the_same_across_a_restart_and_the_secret_is_the_owners_only(tmp_path: Path) -> None:
    settings = GatewaySettings(data_dir=tmp_path, api_key=STRONG_A)
    first = auth.KeyRing.for_gateway(settings).check(STRONG_A)
    again = auth.KeyRing.for_gateway(settings).check(STRONG_A)
    assert first is not None and first == again
    secret = tmp_path / auth.KEY_ID_KEY_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and len(secret.read_bytes()) == auth.KEY_ID_KEY_BYTES
    assert first == auth.key_id(STRONG_A, secret.read_bytes())
    assert auth.KeyRing.for_gateway(settings).renamed == {auth.legacy_key_id(STRONG_A): first}
    secret.write_bytes(b"short")
    with pytest.raises(KeyIdKeyUnusable, match="not a 32-byte key"):
        auth.KeyRing.for_gateway(settings)


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


KEY_ID = "key-aaaaaaaaaaaa"


def _refused(check: Callable[[], None]) -> tuple[type[Exception], str]:
    with pytest.raises(CodedError) as caught:
        check()
    return type(caught.value), caught.value.message


def test_a_key_opens_its_own_sessions_live_or_kept() -> None:
    owner = auth.Caller(key_id=KEY_ID, presented=True)
    assert owner.api_key() == KEY_ID
    owner.open_live("ses_1", KEY_ID)
    owner.open_kept(KEY_ID, "no recording")
    owner.change_egress()
    assert _refused(lambda: owner.open_live("ses_1", "key-other")) == (
        Forbidden,
        "this session belongs to another API key",
    )
    assert _refused(lambda: owner.open_kept("key-other", "no recording")) == (
        Forbidden,
        "this session belongs to another API key",
    )
    assert _refused(lambda: owner.open_live("ses_1", None)) == (SessionNotFound, "no session ses_1")
    assert _refused(lambda: owner.open_kept(None, "no recording of session ses_1")) == (
        NotFound,
        "no recording of session ses_1",
    )


def test_a_session_token_opens_its_own_live_session_and_nothing_else() -> None:
    holder = auth.Caller(session_id="ses_1", presented=True)
    holder.open_live("ses_1", KEY_ID)
    assert _refused(lambda: holder.open_live("ses_2", KEY_ID)) == (
        Forbidden,
        "a session token only opens its own session",
    )
    assert _refused(holder.api_key) == (Unauthorized, "that API key is not valid")
    assert _refused(holder.change_egress) == (Forbidden, "changing a session's egress needs its owner's API key")


def test_nobody_is_told_what_to_send() -> None:
    nobody, stranger = auth.Caller(), auth.Caller(presented=True)
    assert _refused(nobody.api_key) == (Unauthorized, "send an API key as 'Authorization: Bearer <key>'")
    assert _refused(lambda: nobody.open_live("ses_1", None))[0] is Unauthorized
    # An unknown credential learns nothing of which sessions exist: 401 before 404.
    assert _refused(lambda: stranger.open_live("ses_1", None)) == (Unauthorized, "that API key or token is not valid")
    assert _refused(lambda: stranger.open_live("ses_1", KEY_ID))[0] is Unauthorized


def test_the_keyring_of_a_gateway(tmp_path: Path) -> None:
    given = auth.KeyRing.for_gateway(GatewaySettings(data_dir=tmp_path, api_key=f" {STRONG_A} , {STRONG_B} ,"))
    secret = auth.load_key_id_key(tmp_path)
    assert given.check(STRONG_A) == auth.key_id(STRONG_A, secret)
    assert given.check(STRONG_B) == auth.key_id(STRONG_B, secret)
    assert not (tmp_path / auth.KEY_FILE).exists()
    generated = auth.KeyRing.for_gateway(GatewaySettings(data_dir=tmp_path, api_key=""))
    assert generated.check(auth.load_or_create_key(tmp_path)) is not None


def test_a_viewer_link_opens_its_session_s_viewer_and_live_stream_only() -> None:
    viewer = auth.Caller(presented=True, link=auth.LinkGrant("ses_1", "lnk_3kq9x0a1b2c4", "view"))
    viewer.open_view("ses_1", KEY_ID)
    assert viewer.live_viewer("ses_1", KEY_ID) == ("human:lnk_3kq9x0a1b2c4", "view")
    link_only = (Forbidden, "a viewer link opens only its session's viewer and live stream")
    assert _refused(lambda: viewer.open_live("ses_1", KEY_ID)) == link_only  # no actions, files, session
    assert _refused(viewer.api_key) == link_only
    assert _refused(lambda: viewer.open_view("ses_2", KEY_ID)) == (Forbidden, "this viewer link is for another session")
    assert _refused(lambda: viewer.live_viewer("ses_2", KEY_ID))[0] is Forbidden
    controller = auth.Caller(presented=True, link=auth.LinkGrant("ses_1", "lnk_aaaaaaaaaaaa", "control"))
    assert controller.live_viewer("ses_1", KEY_ID) == ("human:lnk_aaaaaaaaaaaa", "control")


def test_a_revoked_or_expired_link_is_told_which() -> None:
    for reason in ("link revoked", "link expired"):
        gone = auth.Caller(presented=True, link=auth.LinkGrant("ses_1", "lnk_x", "view"), link_refused=reason)
        assert _refused(lambda gone=gone: gone.open_view("ses_1", KEY_ID)) == (Unauthorized, reason)
        assert _refused(gone.api_key) == (Unauthorized, reason)


def test_on_the_live_stream_the_owner_controls_and_the_agent_watches() -> None:
    owner = auth.Caller(key_id=KEY_ID, presented=True)
    assert owner.live_viewer("ses_1", KEY_ID) == ("human:owner", "control")  # never its key id
    assert owner.grant_links() == KEY_ID
    agent = auth.Caller(session_id="ses_1", presented=True)
    assert agent.live_viewer("ses_1", KEY_ID) == ("agent", "view")
    assert _refused(agent.grant_links) == (
        Forbidden,
        "viewer links are made and revoked with the session owner's API key, not its token",
    )
    assert (
        _refused(lambda: auth.Caller(key_id="key-other", presented=True).live_viewer("ses_1", KEY_ID))[0] is Forbidden
    )
