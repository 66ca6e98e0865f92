"""API keys too short or too guessable to hold are refused, by the gateway and by ``corral up``, saying why."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from corral.errors import WeakApiKey
from corral.gateway import auth
from corral.gateway.keystrength import MIN_BITS, estimated_bits, problem, weakness
from corral.gateway.settings import GatewaySettings


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("hunter2", "is 7 characters long, under 32"),
        ("correcthorsebatterystaplecorrecthorse", "uses one kind of character only"),
        ("1234567890123456789012345678901234", "uses one kind of character only"),
        ("abc123" * 6, "is a shorter part repeated"),
        ("a" * 37 + "b1", "bits by its characters"),
        ("Password123Password123Password123x", "bits by its characters"),
    ],
)
def test_weak_keys_are_refused_saying_why(key: str, why: str) -> None:
    said = weakness(key)
    assert said is not None and why in said
    assert key not in str(said)  # the message never quotes the key


def test_random_keys_and_the_gateways_own_pass() -> None:
    # The gateway's own key (load_or_create_key's form) and the ones the message tells operators to make.
    for _ in range(500):
        for key in ("crl_" + secrets.token_urlsafe(32), secrets.token_urlsafe(32), secrets.token_hex(32)):
            assert weakness(key) is None, key
    assert estimated_bits("crl_" + secrets.token_urlsafe(32)) > 2 * MIN_BITS


def test_the_gateways_generated_key_passes(tmp_path: Path) -> None:
    assert weakness(auth.load_or_create_key(tmp_path)) is None


def test_the_message_names_which_key_and_what_to_use() -> None:
    strong = secrets.token_urlsafe(32)
    said = problem([strong, "short"])
    assert said is not None
    assert said.startswith("CORRAL_API_KEY: API key 2 of 2 is 5 characters long, under 32")
    assert "secrets.token_urlsafe(32)" in said and "leave CORRAL_API_KEY unset" in said
    assert problem([strong]) is None and problem([]) is None


def test_the_gateway_refuses_a_weak_key_at_start(tmp_path: Path) -> None:
    settings = GatewaySettings(data_dir=tmp_path, api_key="test-key-a")
    with pytest.raises(WeakApiKey) as refused:
        auth.KeyRing.for_gateway(settings)
    assert str(refused.value).startswith("CORRAL_API_KEY: the API key is 10 characters long, under 32")
    assert refused.value.field == "CORRAL_API_KEY"
    assert not (tmp_path / auth.KEY_ID_KEY_FILE).exists()  # refused before anything is made
