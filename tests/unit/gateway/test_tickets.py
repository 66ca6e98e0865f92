"""CDP connect tickets: signed for one session, expiring, the key kept 0600 in the data dir."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from corral.errors import Forbidden, Unauthorized
from corral.gateway.tickets import KEY_FILE, MAX_TTL_S, TicketSigner


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_ticket_opens_its_session_until_it_expires(tmp_path: Path) -> None:
    clock = Clock()
    signer = TicketSigner(tmp_path, clock)
    text, ticket = signer.issue("s-one", 60, exclusive=True)
    assert ticket.expires_at == int(clock.now) + 60
    assert signer.check(text, "s-one") == ticket
    clock.now += 59
    assert signer.check(text, "s-one").exclusive is True
    clock.now += 1
    with pytest.raises(Unauthorized, match="expired"):
        signer.check(text, "s-one")


def test_another_sessions_ticket_is_forbidden(tmp_path: Path) -> None:
    signer = TicketSigner(tmp_path)
    text, _ = signer.issue("s-one", 60, exclusive=False)
    with pytest.raises(Forbidden):
        signer.check(text, "s-two")


@pytest.mark.parametrize("bad", ["", "x", "a.b", "!!!.???", "a" * 600])
def test_what_is_no_ticket_is_unauthorized(tmp_path: Path, bad: str) -> None:
    with pytest.raises(Unauthorized):
        TicketSigner(tmp_path).check(bad, "s-one")


def test_a_changed_ticket_fails_its_mac(tmp_path: Path) -> None:
    signer = TicketSigner(tmp_path)
    text, _ = signer.issue("s-one", 60, exclusive=False)
    mac = text.partition(".")[2]
    forged, _ = signer.issue("s-one", 60, exclusive=True)
    with pytest.raises(Unauthorized):
        signer.check(f"{forged.partition('.')[0]}.{mac}", "s-one")  # exclusive's payload, the other's MAC
    other = TicketSigner(tmp_path / "other")
    with pytest.raises(Unauthorized):
        other.check(text, "s-one")  # another gateway's key


def test_the_key_is_kept_private_and_outlives_the_signer(tmp_path: Path) -> None:
    text, _ = TicketSigner(tmp_path).issue("s-one", 60, exclusive=False)
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert TicketSigner(tmp_path).check(text, "s-one").session_id == "s-one"  # a restarted gateway


def test_the_ttl_is_capped(tmp_path: Path) -> None:
    clock = Clock()
    _, ticket = TicketSigner(tmp_path, clock).issue("s-one", 10_000, exclusive=False)
    assert ticket.expires_at == int(clock.now) + MAX_TTL_S
