"""The controller's per-boot secret scheme: signed requests, one use each, and the reply's proof."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.contracts import auth

SECRET = auth.new_secret()


def test_a_signed_request_verifies_once_and_its_reply_proves_the_secret() -> None:
    verifier = auth.RequestVerifier(SECRET)
    signed = auth.sign(SECRET, now=1_000_000)
    nonce = verifier.verify(signed.headers[auth.AUTH_HEADER], now=1_000_010)
    assert nonce == signed.nonce
    with pytest.raises(ValueError, match="used before"):
        verifier.verify(signed.headers[auth.AUTH_HEADER], now=1_000_011)
    assert auth.proven(SECRET, nonce, {auth.PROOF_HEADER: auth.prove(SECRET, nonce)})
    # An impostor without the secret cannot prove it, nor reuse a proof for another nonce.
    assert not auth.proven(SECRET, nonce, {auth.PROOF_HEADER: auth.prove(auth.new_secret(), nonce)})
    assert not auth.proven(SECRET, nonce, {auth.PROOF_HEADER: auth.prove(SECRET, "another")})
    assert not auth.proven(SECRET, nonce, {})


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "malformed"),
        ("Bearer x", "malformed"),
        ("v2.1000000.n.mac", "malformed"),
        ("v1.soon.n.mac", "malformed"),
        ("v1.1000000.nonce.0000", "does not match"),
    ],
)
def test_bad_values_are_refused_with_a_reason(value: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        auth.RequestVerifier(SECRET).verify(value, now=1_000_000)


def test_another_secret_and_stale_stamps_are_refused() -> None:
    verifier = auth.RequestVerifier(SECRET)
    with pytest.raises(ValueError, match="does not match"):
        verifier.verify(auth.sign(auth.new_secret(), now=1_000_000).headers[auth.AUTH_HEADER], now=1_000_000)
    for skew in (-auth.MAX_SKEW_S - 1, auth.MAX_SKEW_S + 1):
        stale = auth.sign(SECRET, now=1_000_000 + skew).headers[auth.AUTH_HEADER]
        with pytest.raises(ValueError, match="stale"):
            verifier.verify(stale, now=1_000_000)


def test_nonces_are_forgotten_once_no_valid_stamp_can_bring_them_back() -> None:
    verifier = auth.RequestVerifier(SECRET)
    for second in range(5):
        verifier.verify(auth.sign(SECRET, now=1_000_000 + second).headers[auth.AUTH_HEADER], now=1_000_000 + second)
    later = 1_000_000 + 3 * auth.MAX_SKEW_S
    verifier.verify(auth.sign(SECRET, now=later).headers[auth.AUTH_HEADER], now=later)
    assert len(verifier._seen) == 1


def test_the_secret_file_must_hold_a_secret(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    assert auth.read_secret(path) == SECRET
    for bad in ("", "short", "x" * 40 + " y"):
        path.write_text(bad)
        with pytest.raises(ValueError):
            auth.read_secret(path)
    with pytest.raises(OSError):
        auth.read_secret(tmp_path / "missing")
