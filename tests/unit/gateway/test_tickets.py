"""CDP connect tickets: signed for one session, expiring, the key kept 0600 in the data dir."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.errors import Forbidden, TicketKeyUnusable, Unauthorized
from corral.gateway.routes.errors import answer_for
from corral.gateway.tickets import KEY_BYTES, KEY_FILE, MAX_TTL_S, TicketSigner


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


@pytest.mark.parametrize("stored", [b"", b"short", b"k" * (KEY_BYTES + 1)])
def test_a_key_file_holding_no_key_refuses_every_time(tmp_path: Path, stored: bytes) -> None:
    ticket, _ = TicketSigner(tmp_path / "good").issue("s-one", 60, exclusive=False)
    (tmp_path / KEY_FILE).write_bytes(stored)
    signer = TicketSigner(tmp_path)
    for _ in range(2):  # never a ticket signed with what the first failure kept
        with pytest.raises(TicketKeyUnusable):
            signer.issue("s-one", 60, exclusive=False)
        with pytest.raises(TicketKeyUnusable):
            signer.check(ticket, "s-one")
    assert answer_for(TicketKeyUnusable("x")).status == 500


def test_a_new_key_is_linked_into_place_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real_link = os.link

    def link(source: str | os.PathLike[str], destination: str | os.PathLike[str]) -> None:
        seen.append(Path(source).stat().st_size)  # written and synced before it has the key's name
        real_link(source, destination)

    monkeypatch.setattr(os, "link", link)
    key = TicketSigner(tmp_path).key()
    assert seen == [KEY_BYTES] and len(key) == KEY_BYTES
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE]  # no temporary file left behind
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600


def test_a_key_made_meanwhile_by_another_gateway_is_the_one_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = b"t" * KEY_BYTES
    real_link = os.link

    def raced(source: str | os.PathLike[str], destination: str | os.PathLike[str]) -> None:
        Path(destination).write_bytes(theirs)  # the other gateway linked its key first
        real_link(source, destination)

    monkeypatch.setattr(os, "link", raced)
    assert TicketSigner(tmp_path).key() == theirs
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE]
