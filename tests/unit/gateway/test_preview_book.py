"""Port previews' book (corral.gateway.previews.book) and who a request reaches
(corral.gateway.previews.access): a secret kept only as its SHA-256, matched in constant time,
expiring with its session at the latest; a revoke closes every open connection at once; bytes and
connections counted; each change and each connection reported to the audit chain."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from corral.contracts.control import PreviewEvent
from corral.errors import EgressUnavailable, Forbidden, Unauthorized
from corral.gateway.auth import digest
from corral.gateway.previews import book as previews
from corral.gateway.previews.access import NO_SECRET, WRONG_SECRET, Admitted, admit, check_initiator
from corral.gateway.previews.book import PreviewBook, PreviewConnection, PreviewRecord
from corral.gateway.previews.wire import Presented


class Book:
    """A PreviewBook over one session's previews in a dict, its reports kept, on a clock the test moves."""

    def __init__(self, fail_reports: bool = False) -> None:
        self.previews: dict[str, PreviewRecord] = {}
        self.reports: list[dict[str, Any]] = []
        self.fail_reports = fail_reports
        self.time = 1000.0
        self.book = PreviewBook(self._of, self._save, self._report, clock=lambda: self.time)

    def _of(self, session_id: str) -> Mapping[str, PreviewRecord]:
        assert session_id == "ses_a"
        return self.previews

    def _save(self, session_id: str, saved: Mapping[str, PreviewRecord]) -> None:
        self.previews = dict(saved)

    async def _report(self, session_id: str, message: PreviewEvent) -> None:
        if self.fail_reports:
            raise EgressUnavailable("the proxy does not answer")
        self.reports.append(message.to_json())

    def changes(self) -> list[str]:
        return [r["change"] for r in self.reports]


class FakeSession:
    id = "ses_a"


def test_a_preview_keeps_only_its_secret_s_digest_and_expires_with_its_session_at_the_latest() -> None:
    preview, secret = previews.make(3000, 3600, "key-owner", session_expires_at=1500.0, now=1000.0)
    assert re.fullmatch(r"crl_prev_[A-Za-z0-9_-]{43}", secret)
    assert re.fullmatch(r"prv_[a-z2-7]{12}", preview.id)
    assert preview.secret_sha256 == digest(secret) and secret not in preview.model_dump_json()
    assert (preview.port, preview.created_at, preview.expires_at) == (3000, 1000.0, 1500.0)
    assert preview.problem(1499.0) is None and preview.problem(1500.0) == "preview expired"
    assert preview.model_copy(update={"revoked_at": 1200.0}).problem(1300.0) == "preview revoked"


def test_a_secret_matches_its_own_preview_only() -> None:
    first, first_secret = previews.make(3000, 60, "k", 1e12, 0.0)
    second, second_secret = previews.make(3000, 60, "k", 1e12, 0.0)
    assert previews.match(first_secret, [first, second]) == first
    assert previews.match(second_secret, [first, second]) == second
    assert previews.match(first_secret[:-1] + "x", [first, second]) is None


async def test_create_reports_before_it_keeps_and_a_failed_report_makes_none() -> None:
    failing = Book(fail_reports=True)
    with pytest.raises(EgressUnavailable):
        await failing.book.create("ses_a", 3000, 60, "key-owner", 1e12)
    assert failing.previews == {}
    book = Book()
    preview, _ = await book.book.create("ses_a", 3000, 60, "key-owner", 1e12)
    assert book.previews == {preview.id: preview}
    assert book.reports == [
        {
            "op": "preview",
            "change": "created",
            "preview": preview.id,
            "port": 3000,
            "actor": "api-key:owner",
            "expires_at": 1060.0,
        }
    ]


async def test_connections_are_counted_and_a_revoke_closes_them_at_once() -> None:
    book = Book()
    preview, _ = await book.book.create("ses_a", 3000, 60, "key-owner", 1e12)
    first, second = PreviewConnection("127.0.0.1:1"), PreviewConnection("127.0.0.1:2")
    book.book.opened(first, "ses_a", preview.id)
    book.book.opened(second, "ses_a", preview.id)
    first.bytes_in, first.bytes_out = 10, 2000
    assert book.book.open_connections(preview.id) == 2
    seen = book.book.current(book.previews[preview.id])
    assert (seen.connections, seen.bytes_in, seen.bytes_out, seen.last_used_at) == (2, 10, 2000, 1000.0)
    book.time = 1010.0
    book.book.closed(first)
    assert book.previews[preview.id].connections == 0  # counted in memory: no record written per connection
    seen = book.book.current(book.previews[preview.id])
    assert (seen.connections, seen.bytes_in, seen.bytes_out, seen.last_used_at) == (2, 10, 2000, 1010.0)
    await book.book.drain()  # the connections' records go by kept tasks
    revoked = await book.book.revoke("ses_a", preview.id)
    assert revoked is not None and revoked.revoked_at == 1010.0
    stored = book.previews[preview.id]  # the revoke's write carries the use counted so far
    assert (stored.connections, stored.bytes_in, stored.bytes_out, stored.last_used_at) == (2, 10, 2000, 1010.0)
    assert second.closing.is_set() and second.reason == "preview revoked" and not first.closing.is_set()
    assert await book.book.revoke("ses_a", preview.id) == revoked  # twice: the same
    assert await book.book.revoke("ses_a", "prv_none") is None
    book.book.closed(second)
    await book.book.drain()
    assert book.changes() == ["created", "opened", "opened", "closed", "revoked", "closed"]
    closed = book.reports[3]
    assert (closed["remote"], closed["bytes_in"], closed["bytes_out"]) == ("127.0.0.1:1", 10, 2000)


async def test_a_connection_never_admitted_counts_for_no_preview() -> None:
    book = Book()
    book.book.closed(PreviewConnection("127.0.0.1:1"))
    await book.book.drain()
    assert book.reports == []


async def test_a_revoke_is_not_held_back_by_a_failing_audit() -> None:
    book = Book()
    preview, _ = await book.book.create("ses_a", 3000, 60, "key-owner", 1e12)
    book.fail_reports = True
    revoked = await book.book.revoke("ses_a", preview.id)
    assert revoked is not None and book.previews[preview.id].revoked_at is not None


async def test_admit_takes_the_first_good_secret_and_says_why_otherwise() -> None:
    book = Book()
    preview, secret = await book.book.create("ses_a", 3000, 60, "key-owner", 1e12)
    other, other_secret = await book.book.create("ses_a", 4000, 60, "key-owner", 1e12)
    session: Any = FakeSession()

    def presented(query: str | None = None, header: str | None = None, **cookies: str) -> Presented:
        return Presented(query, header, dict(cookies))

    assert admit(presented(header=secret), session, 3000, book.book).via == "header"
    assert admit(presented(query=secret), session, 3000, book.book).via == "query"
    assert admit(presented(**{preview.id: secret}), session, 3000, book.book).via == "cookie"
    for refused, reason in [
        (presented(), NO_SECRET),
        (presented(header="crl_prev_wrong"), WRONG_SECRET),
        (presented(header=other_secret), WRONG_SECRET),  # another port's preview opens nothing here
        (presented(**{other.id: other_secret}), WRONG_SECRET),
    ]:
        with pytest.raises(Unauthorized) as exc:
            admit(refused, session, 3000, book.book)
        assert str(exc.value) == reason
    # A stale cookie beside a good header: the header admits.
    assert admit(presented(header=secret, **{preview.id: "old"}), session, 3000, book.book).via == "header"
    await book.book.revoke("ses_a", preview.id)
    with pytest.raises(Unauthorized, match="preview revoked"):
        admit(presented(**{preview.id: secret}), session, 3000, book.book)
    book.time = 2000.0
    with pytest.raises(Unauthorized, match="preview expired"):
        admit(presented(header=other_secret), session, 4000, book.book)
    await book.book.drain()
    assert book.changes()[-1] == "expired"


def test_another_site_s_page_gets_only_lax_s_navigations_with_the_cookie() -> None:
    record = PreviewRecord(id="prv_x", port=3000, secret_sha256="", created_by="k", created_at=0, expires_at=1e12)
    session: Any = FakeSession()
    cookie, header = Admitted(session, record, "s", "cookie"), Admitted(session, record, "s", "header")
    stranger = [(b"sec-fetch-site", b"same-site"), (b"origin", b"http://3000-bb.localhost:8701")]
    sibling = [(b"sec-fetch-site", b"same-site"), (b"referer", b"http://4000-a.localhost:8701/x")]
    navigation = [*stranger, (b"sec-fetch-mode", b"navigate"), (b"sec-fetch-dest", b"document")]
    framed = [*stranger, (b"sec-fetch-mode", b"navigate"), (b"sec-fetch-dest", b"iframe")]
    for method, headers in [(b"POST", stranger), (b"GET", stranger), (b"POST", navigation), (b"GET", framed)]:
        with pytest.raises(Forbidden):
            check_initiator(cookie, method, headers, "localhost")
    with pytest.raises(Forbidden):  # a same-site page that does not say which: not this session's
        check_initiator(cookie, b"GET", [(b"sec-fetch-site", b"same-site")], "localhost")
    with pytest.raises(Forbidden):  # a browser without Fetch Metadata still names the page's origin
        check_initiator(cookie, b"POST", [(b"origin", b"http://3000-bb.localhost:8701")], "localhost")
    for admitted, method, headers in [
        (cookie, b"GET", navigation),  # a link followed: what Lax lets through from any site
        (cookie, b"POST", sibling),  # a page of the same session's other port
        (cookie, b"POST", [(b"sec-fetch-site", b"same-origin")]),
        (cookie, b"POST", [(b"origin", b"http://4000-a.localhost:8701")]),  # no Fetch Metadata, its own session
        (cookie, b"POST", [(b"origin", b"http://elsewhere.test")]),  # cross-site: Lax keeps the cookie back
        (header, b"POST", stranger),  # the secret's holder sent it
    ]:
        check_initiator(admitted, method, headers, "localhost")
