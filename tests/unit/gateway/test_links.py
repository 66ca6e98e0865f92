"""Viewer links (corral.gateway.links): made with a secret kept only as its SHA-256, matched in
constant time, expiring with their session at the latest, revoked at once, each change reported."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from corral.contracts.control import LinkEvent
from corral.errors import EgressUnavailable
from corral.gateway import links
from corral.gateway.auth import LinkGrant, digest
from corral.gateway.links import LinkBook, LinkRecord


class Book:
    """A LinkBook over one session's links in a dict, its reports kept, on a clock the test moves."""

    def __init__(self, fail_reports: bool = False) -> None:
        self.links: dict[str, LinkRecord] = {}
        self.saved: list[dict[str, LinkRecord]] = []
        self.reports: list[dict[str, Any]] = []
        self.fail_reports = fail_reports
        self.time = 1000.0
        self.book = LinkBook(self._links_of, self._save, self._report, clock=lambda: self.time)

    def _links_of(self, session_id: str) -> Mapping[str, LinkRecord]:
        assert session_id == "ses_a"
        return self.links

    def _save(self, session_id: str, saved: Mapping[str, LinkRecord]) -> None:
        self.links = dict(saved)
        self.saved.append(self.links)

    async def _report(self, session_id: str, message: LinkEvent) -> None:
        if self.fail_reports:
            raise EgressUnavailable("the proxy does not answer")
        self.reports.append(message.to_json())  # as it goes on the wire

    def changes(self) -> list[tuple[str, str]]:
        return [(r["change"], r["link"]) for r in self.reports]


def test_a_link_keeps_only_its_secret_s_digest_and_expires_with_its_session_at_the_latest() -> None:
    link, secret = links.make("control", 3600, "key-owner", session_expires_at=1500.0, now=1000.0)
    assert re.fullmatch(r"crl_link_[A-Za-z0-9_-]{43}", secret)
    assert re.fullmatch(r"lnk_[a-z2-7]{12}", link.id)
    assert link.secret_sha256 == digest(secret) and secret not in link.model_dump_json()
    assert (link.created_at, link.expires_at) == (1000.0, 1500.0)  # capped at the session's end
    assert link.grant("ses_a") == LinkGrant("ses_a", link.id, "control")
    assert link.grant("ses_a").actor == f"human:{link.id}"


def test_a_secret_matches_its_own_link_only() -> None:
    first, first_secret = links.make("view", 60, "key-a", 1e12, 0.0)
    second, second_secret = links.make("view", 60, "key-a", 1e12, 0.0)
    assert links.match(first_secret, [first, second]) == first
    assert links.match(second_secret, [first, second]) == second
    assert links.match(first_secret[:-1] + "x", [first, second]) is None


def test_a_link_says_why_it_opens_nothing() -> None:
    link, _ = links.make("view", 60, "key-a", 1e12, 100.0)
    assert link.problem(159.9) is None
    assert link.problem(160.0) == "link expired"
    assert link.model_copy(update={"revoked_at": 120.0}).problem(130.0) == "link revoked"


async def test_create_reports_then_keeps_the_link() -> None:
    book = Book()
    link, secret = await book.book.create("ses_a", "view", 60, "key-owner", 1e12)
    assert book.links == {link.id: link} and links.match(secret, book.links.values()) == link
    assert book.reports == [
        {
            "op": "link",
            "change": "created",
            "link": link.id,
            "mode": "view",
            "actor": "api-key:owner",  # the agent reads the audit log: never the key's id
            "expires_at": 1060.0,
        }
    ]


async def test_a_link_the_audit_did_not_take_is_never_made() -> None:
    book = Book(fail_reports=True)
    with pytest.raises(EgressUnavailable):
        await book.book.create("ses_a", "control", 60, "key-owner", 1e12)
    assert book.links == {} and book.saved == []


async def test_revoke_closes_the_link_s_streams_at_once_and_twice_is_once() -> None:
    book = Book()
    link, _ = await book.book.create("ses_a", "control", 60, "key-owner", 1e12)
    stream, other = links.LinkStream(link.id), links.LinkStream(link.id)
    await book.book.opened("ses_a", stream)
    await book.book.opened("ses_a", other)
    assert book.book.streams(link.id) == 2 and book.links[link.id].last_used_at == 1000.0
    book.time = 1010.0
    revoked = await book.book.revoke("ses_a", link.id)
    assert revoked is not None and revoked.revoked_at == 1010.0
    assert stream.closing.is_set() and other.closing.is_set() and stream.reason == "link revoked"
    again = await book.book.revoke("ses_a", link.id)
    assert again == revoked  # unchanged, reported once
    book.book.closed(stream)
    book.book.closed(other)
    assert book.book.streams(link.id) == 0
    assert book.changes() == [("created", link.id), ("used", link.id), ("used", link.id), ("revoked", link.id)]
    assert await book.book.revoke("ses_a", "lnk_unknown") is None


async def test_a_revoke_the_audit_did_not_take_still_revokes() -> None:
    book = Book()
    link, _ = await book.book.create("ses_a", "view", 60, "key-owner", 1e12)
    book.fail_reports = True
    revoked = await book.book.revoke("ses_a", link.id)
    assert revoked is not None and book.links[link.id].problem(book.time) == "link revoked"


async def test_expiry_is_reported_once() -> None:
    book = Book()
    link, _ = await book.book.create("ses_a", "view", 60, "key-owner", 1e12)
    book.time = 2000.0
    book.book.expired("ses_a", link.id)
    book.book.expired("ses_a", link.id)
    await book.book.drain()
    assert book.changes() == [("created", link.id), ("expired", link.id)]
    assert book.links[link.id].expiry_reported


async def test_http_reads_report_the_link_s_use_once_a_minute() -> None:
    book = Book()
    link, _ = await book.book.create("ses_a", "view", 3600, "key-owner", 1e12)
    book.time = 1010.0
    book.book.read("ses_a", link.id)
    book.time = 1069.0
    book.book.read("ses_a", link.id)  # within the minute: kept quiet
    await book.book.drain()
    assert book.changes() == [("created", link.id), ("used", link.id)]
    assert book.links[link.id].last_used_at == 1010.0
    book.time = 1070.0
    book.book.read("ses_a", link.id)
    await book.book.drain()
    assert book.changes()[-1] == ("used", link.id) and len(book.changes()) == 3
    assert book.links[link.id].last_used_at == 1070.0
