"""Brokered secrets: the sandbox holds placeholders, the proxy puts the real values in on the way
out (to bound hosts, methods, paths and locations only) and takes them out of what comes back.

Runs after :class:`~corral.proxy.addons.PolicyGate` (a refused flow is never looked at) and before
the addons that record a flow (:class:`~corral.proxy.addons.AuditTrail`,
:class:`~corral.proxy.addons.ResponseRecorder`): the request that went upstream with values is
swapped back for the placeholder form at ``response`` and ``error``, so what they record holds
placeholders only. The engine is pure (:mod:`corral.proxy.secrets`); this reads a flow into bytes
and writes the outcome back. With no secrets every hook returns at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mitmproxy import ctx, http

from corral.contracts.placeholders import PLACEHOLDER_PREFIX, Location
from corral.errors import DecodedTooLarge
from corral.proxy.addons.flows import url_of
from corral.proxy.addons.state import FlowNote, Shared, note_of
from corral.proxy.addons.trail import exchange
from corral.proxy.audit import EventFields, is_secret_header, redact_url
from corral.proxy.policy import Decision
from corral.proxy.refusal import refusal_response
from corral.proxy.secrets import (
    METHOD_FIELD,
    METHOD_OVERRIDES,
    SECRETS_FILE,
    BodyType,
    Scrubber,
    Secret,
    SecretBook,
    basic_credentials,
    basic_header,
    body_type,
    clean_path,
    decoded,
    encoded_for,
    path_problem,
    placeholders_in,
    without_placeholders,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

ORIGINAL = "corral.secrets.original"  # flow.metadata: the request as the sandbox sent it
MISUSE, UNAVAILABLE, REFLECTION = "secret-misuse", "secret-unavailable", "secret-reflection"
SUBSTITUTION = "secret-substitution"
PLACEHOLDER_PREFIX_BYTES = PLACEHOLDER_PREFIX.encode()
TRAILERS = "requests with trailers are refused while secrets are live"
Place = Location | str  # a request location, or "path", "method", "header-name" (where no secret may go)
THREAD_MIN = 1024 * 1024  # a body longer than this is read in a worker thread (the loop serves others)
IDENTITY = ("", "identity", "none")  # Content-Encoding values that leave a body as it is (secrets.decoded)
THREAD_MIN_COMPRESSED = 1024  # the same for a compressed one (gzip reaches 1:1000: 1 MB)


@dataclass(frozen=True, slots=True)
class Refusal:
    secret: str | None
    location: str | None
    reason: str
    rule: str = MISUSE
    status: int = 403
    exfiltration: bool = True


@dataclass(frozen=True, slots=True)
class Sent:
    """What substitution changes in a request, as the sandbox sent it."""

    path: bytes
    fields: tuple[tuple[bytes, bytes], ...]
    raw_content: bytes | None


@dataclass(slots=True)
class Parts:
    """A request read for secrets: where each part is, as bytes."""

    path: bytes
    query: bytes
    headers: list[tuple[bytes, bytes]]
    basic: list[tuple[int, bytes]]  # (index in headers, decoded user:password)
    body: bytes
    kind: BodyType | None
    media: str = "none"  # the Content-Type, as sent
    method: bytes = b""

    def places(self) -> list[tuple[Place, bytes]]:
        """Each part with where it is; Basic credentials decoded. A header whose name does not say
        it carries a credential is place ``header:NAME`` (no secret goes there: a User-Agent or a
        Referer is copied to logs and third parties)."""
        places: list[tuple[Place, bytes]] = [("path", self.path), ("query", self.query), ("body", self.body)]
        places.append(("method", self.method))
        places += [("header-name", name) for name, _ in self.headers]
        places += [(_header_place(name), value) for name, value in self.headers]
        places += [("basic", credentials) for _, credentials in self.basic]
        return places


@functools.lru_cache(maxsize=1024)
def _header_place(name: bytes) -> Place:
    text = name.decode("latin-1")
    return "header" if is_secret_header(text) else f"header:{text.lower()}"


class SecretBroker:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.book: SecretBook = shared.secrets
        self.journal = shared.journal
        self._restored = False

    def configure(self, updated: set[str]) -> None:
        state_dir = ctx.options.corral_state_dir
        if self._restored or "corral_state_dir" not in updated or not state_dir:
            return
        self._restored = True
        path = Path(state_dir) / SECRETS_FILE
        try:
            if self.book.restore(path):
                log.info("brokered secrets restored (%d), values not loaded", len(self.book.secrets))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # A warning, never an exception or an error: mitmdump exits on either at startup. The
            # gateway's watchdog sees no names and sends the set again.
            log.warning("cannot read the persisted secrets in %s (%s); starting without", path, exc)

    # -- requests --------------------------------------------------------------------------------

    async def request(self, flow: http.HTTPFlow) -> None:
        book = self.book
        if not book.active:
            return
        note = note_of(flow)
        if note is None or flow.response is not None or flow.request.method == "CONNECT":
            return
        if flow.request.trailers:  # they come after the body, past any look at it
            self._refuse(flow, note, Refusal(None, "trailers", TRAILERS))
            return
        try:
            parts, inside, found = await _off_loop(flow.request, self._read, flow.request)
        except ValueError as exc:
            self._refuse(flow, note, _unreadable(exc))
            return
        if inside is not None:
            _scrub_request(flow.request, book)  # refused all the same; its record holds no value
            self._refuse(flow, note, inside)
            return
        refusal = self._check(flow, note, parts, found) if found else None
        if refusal is None and not book.loaded:
            refusal = _waiting(book, note.host, flow.request.port)
        if refusal is not None:
            self._refuse(flow, note, refusal)
            return
        if not found:
            return
        request = flow.request
        # What substitution changes, kept to be put back (a whole copy of the request costs more
        # than everything else here together).
        flow.metadata[ORIGINAL] = Sent(request.data.path, request.headers.fields, request.raw_content)
        sent_url = redact_url(url_of(request, note.host))  # as the sandbox sent it: placeholders
        counts = _substitute(request, parts, {self.book.by_placeholder[p] for _, p in found})
        for (name, location), count in counts.items():
            self._record(flow, note, name, location, count, SUBSTITUTION, sent_url)

    def _read(self, request: http.Request) -> tuple[Parts, Refusal | None, list[tuple[Place, bytes]]]:
        """The request's parts, a value from inside, and this session's placeholders with where;
        raises ValueError when its body cannot be read (DecodedTooLarge past the cap)."""
        parts = _parts(request)
        places = parts.places()
        whole = b"\n".join(data for _, data in places)  # one look at the whole first, the places only then
        inside = self._value_inside(places, whole)
        return parts, inside, [] if inside is not None else self._find(places, whole)

    def _value_inside(self, places: list[tuple[Place, bytes]], whole: bytes) -> Refusal | None:
        """A real value in the request (the sandbox should never hold one): refused as misuse."""
        scrubber = self.book.scrubber
        if not scrubber or scrubber.first(without_placeholders(whole)) is None:  # the usual answer: none
            return None
        for place, data in places:
            secret = scrubber.first(without_placeholders(data))
            if secret is not None:
                reason = (
                    f"the request carries the value of secret {secret.name} itself (only its placeholder may be sent)"
                )
                return Refusal(secret.name, place.partition(":")[0], reason)
        return None

    def _find(self, places: list[tuple[Place, bytes]], whole: bytes) -> list[tuple[Place, bytes]]:
        """Every placeholder of this session (live or revoked) and where; values are checked apart."""
        if PLACEHOLDER_PREFIX_BYTES not in whole:
            return []
        known = self.book.known
        return [
            (place, p)
            for place, data in places
            if PLACEHOLDER_PREFIX_BYTES in data
            for p in placeholders_in(data)
            if p in known
        ]

    def _check(
        self, flow: http.HTTPFlow, note: FlowNote, parts: Parts, found: list[tuple[Place, bytes]]
    ) -> Refusal | None:
        """Why the request may not go (the first reason), or None when every placeholder may."""
        route = _route_of(flow.request, note, parts)
        unavailable: Refusal | None = None
        for place, placeholder in found:
            secret = self.book.by_placeholder.get(placeholder)
            if secret is None:
                name = self.book.revoked_bytes[placeholder]
                return Refusal(name, place, f"secret {name} was revoked")
            refusal = _misplaced(secret, place, parts) or _misrouted(secret, place, route)
            if refusal is not None:
                return refusal
            if secret.value is None and unavailable is None:
                reason = (
                    f"secret {secret.name} is not loaded yet (the egress proxy restarted; the gateway sends it again)"
                )
                unavailable = Refusal(secret.name, place, reason, UNAVAILABLE, 503, exfiltration=False)
        return unavailable

    def _refuse(self, flow: http.HTTPFlow, note: FlowNote, refusal: Refusal) -> None:
        note.refuse(Decision(False, refusal.reason, refusal.rule), refusal.status)
        if refusal.secret is not None:
            note.extra = {"secret": refusal.secret, "location": str(refusal.location)}
            if refusal.exfiltration:
                note.extra["exfiltration"] = True
        flow.response = refusal_response(
            refusal.status, note.host, note.verdict.decision, flow.request.headers.get("accept", "")
        )

    # -- answers ---------------------------------------------------------------------------------

    async def response(self, flow: http.HTTPFlow) -> None:
        _put_back(flow)  # what the records after this one see: placeholders only
        if not self.book.scrubber:
            return
        note = note_of(flow)
        response = flow.response
        if note is None or response is None or note.verdict.refused or flow.is_replay:
            return
        await self._scrub_answer(flow, note, response)

    def error(self, flow: http.HTTPFlow) -> None:
        _put_back(flow)
        if not self.book.scrubber or flow.error is None:
            return
        # mitmproxy quotes what upstream sent in its error (and in the 502 page it would send).
        clean, counts = self.book.scrubber.scrub(flow.error.msg.encode("utf-8", "surrogateescape"))
        if counts:
            flow.error.msg = clean.decode("utf-8", "surrogateescape")
            if flow.killable:
                # No error page quoting it to the sandbox; mitmproxy knows a kill by the error's
                # message, so the record then says "Connection killed." (nothing else to scrub).
                flow.kill()  # type: ignore[no-untyped-call,unused-ignore]
            # A page mitmproxy makes from its own text (an answer's header it refuses to pass,
            # quoted) ignores the kill: closed first, the client connection gets none.
            _close_client(flow)

    def _refuse_answer(self, flow: http.HTTPFlow, note: FlowNote, reason: str) -> None:
        note.refuse(Decision(False, reason, REFLECTION), 502)
        flow.response = refusal_response(502, note.host, note.verdict.decision, flow.request.headers.get("accept", ""))

    async def _scrub_answer(self, flow: http.HTTPFlow, note: FlowNote, response: http.Response) -> None:
        scrubber = self.book.scrubber
        coding = _header(response.headers.fields, b"transfer-encoding").strip().lower()
        if coding and coding != "chunked":
            self._refuse_answer(
                flow, note, f"the answer's transfer encoding ({coding}) hides it from the scrubbing of secrets"
            )
            return
        if _plainly_clean(response, scrubber):  # the usual small answer: one look, no copies to scrub
            return
        header_counts = _scrub_heads(response, scrubber)
        if response.raw_content:
            try:
                clean, body_counts = await _off_loop(response, _scrub_body, response, self.book)
            except DecodedTooLarge as exc:
                self._refuse_answer(flow, note, f"the answer's body is too large to take secrets out of ({exc})")
                return
            except ValueError:
                encoding = response.headers.get("content-encoding", "")
                self._refuse_answer(flow, note, f"the answer's body cannot be decoded ({encoding}) to take secrets out")
                return
            if body_counts:
                response.content = clean
            for name, count in body_counts.items():
                self._record(flow, note, name, "response-body", count, REFLECTION)
        for name, count in header_counts.items():
            self._record(flow, note, name, "response-header", count, REFLECTION)

    # -- WebSocket -------------------------------------------------------------------------------

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        if not self.book.active or flow.websocket is None or not flow.websocket.messages:
            return
        note = note_of(flow)
        message = flow.websocket.messages[-1]
        if note is None:
            return
        if message.from_client:
            secret = self._carried(message.content)
            if secret is not None:
                message.drop()  # type: ignore[no-untyped-call,unused-ignore]
                if flow.killable:
                    flow.kill()  # type: ignore[no-untyped-call,unused-ignore]
                _close_client(flow)
                reason = f"secret {secret.name} may not be sent in a WebSocket message"
                note.refuse(Decision(False, reason, MISUSE), 403)
                note.extra = {"secret": secret.name, "location": "websocket", "exfiltration": True}
                note.logged = True
                self.journal.write("block", **exchange(flow, note))
            return
        clean, counts = self.book.scrubber.scrub(message.content)
        if counts:
            message.content = clean
            for name, count in counts.items():
                self._record(flow, note, name, "websocket", count, REFLECTION)

    def _carried(self, data: bytes) -> Secret | None:
        """The secret whose placeholder (live or revoked) or value ``data`` holds, or None."""
        for placeholder in placeholders_in(data):
            secret = self.book.by_placeholder.get(placeholder)
            if secret is not None:
                return secret
            if placeholder in self.book.revoked_bytes:
                name = self.book.revoked_bytes[placeholder]
                return Secret(name, placeholder.decode(), None, (), ())
        return self.book.scrubber.first(without_placeholders(data))

    def _record(
        self,
        flow: http.HTTPFlow,
        note: FlowNote,
        name: str,
        location: str,
        count: int,
        rule: str,
        url: str | None = None,
    ) -> None:
        """One ``secret`` record; ``url``: the request's (redacted) as the sandbox sent it, when it
        went out otherwise."""
        request = flow.request
        fields: EventFields = {
            "id": flow.id,
            "method": request.method,
            "url": url if url is not None else redact_url(url_of(request, note.host)),
            "host": note.host,
            "port": request.port,
            "rule": rule,
            "secret": name,
            "location": location,
            "count": count,
        }
        fields.update(note.attribution.record())
        self.journal.write("secret", **fields)


def _put_back(flow: http.HTTPFlow) -> None:
    """The request as the sandbox sent it (placeholders), once it went upstream with values."""
    sent = flow.metadata.pop(ORIGINAL, None)
    if isinstance(sent, Sent):
        request = flow.request
        request.data.path, request.headers.fields, request.raw_content = sent.path, sent.fields, sent.raw_content


def _header(fields: Iterable[tuple[bytes, bytes]], name: bytes, default: str = "") -> str:
    """A header's value, several folded with ", " as ``Headers.get`` folds them: one walk of the fields
    (``Headers.get`` converts every name on each call; this runs a few times per flow)."""
    values = [value for key, value in fields if key.lower() == name]
    return b", ".join(values).decode("utf-8", "surrogateescape") if values else default


async def _off_loop(message: http.Message, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` in a worker thread when ``message``'s body is long, or compressed and may
    decode long (a scan of it would hold up every other flow), else here."""
    size = len(message.raw_content or b"")
    if not size:
        return work(*args)
    coding = _header(message.headers.fields, b"content-encoding", "identity").strip().lower()
    compressed = coding not in ("", "identity")
    if size > THREAD_MIN or (compressed and size > THREAD_MIN_COMPRESSED):
        return await asyncio.to_thread(work, *args)
    return work(*args)


def _scrub_body(response: http.Response, book: SecretBook) -> tuple[bytes, Counter[str]]:
    """The answer's body, decoded, with the values taken out; raises ValueError (DecodedTooLarge)."""
    body = decoded(response.raw_content or b"", _header(response.headers.fields, b"content-encoding"))
    return book.scrubber.scrub(body)


def _heads(response: http.Response) -> bytes:
    """The answer's reason phrase, header names and values and trailers, one a line."""
    fields = response.headers.fields
    trailers = response.trailers.fields if response.trailers is not None else ()
    return b"\n".join([response.data.reason, *(part for field in (*fields, *trailers) for part in field)])


def _plainly_clean(response: http.Response, scrubber: Scrubber) -> bool:
    """Whether an answer whose body is short and not encoded holds no value at all (heads and body
    in one look); False when it may, or when its body must be decoded (or read off the loop) first."""
    body = response.raw_content or b""
    if len(body) > THREAD_MIN or _header(response.headers.fields, b"content-encoding").strip().lower() not in IDENTITY:
        return False
    return scrubber.first(_heads(response) + b"\n" + body) is None


def _scrub_heads(response: http.Response, scrubber: Scrubber) -> Counter[str]:
    """The values taken out of the answer's reason phrase, header names and values and trailers;
    how many, by secret."""
    counts: Counter[str] = Counter()
    if scrubber.first(_heads(response)) is None:
        return counts
    fields = response.headers.fields
    trailers = response.trailers.fields if response.trailers is not None else ()
    response.headers = http.Headers(_scrub_fields(fields, scrubber, counts))
    if response.trailers is not None:
        response.trailers = http.Headers(_scrub_fields(trailers, scrubber, counts))
    response.data.reason, in_reason = scrubber.scrub(response.data.reason)
    counts.update(in_reason)
    return counts


def _waiting(book: SecretBook, host: str, port: int) -> Refusal | None:
    """Why a request to a host a secret is bound to may not go while values are not loaded, or None:
    the host may hand back a value it stored, and the scrubber, which knows loaded values only,
    would let it through."""
    names = book.bound_to(host, port)
    if not names:
        return None
    reason = (
        f"the egress proxy restarted and waits for the gateway to send the secrets again; until then"
        f" {host}:{port} (bound to secret {', '.join(names)}) is not reached"
    )
    return Refusal(None, None, reason, UNAVAILABLE, 503, exfiltration=False)


def _unreadable(exc: ValueError) -> Refusal:
    """Why a request that cannot be read for secrets is refused."""
    if isinstance(exc, DecodedTooLarge):
        return Refusal(
            None,
            "body",
            f"the request body is too large to be read for secrets ({exc})",
            status=413,
            exfiltration=False,
        )
    return Refusal(None, "body", f"the request body cannot be read for secrets: {exc}")


def _scrub_fields(
    fields: Iterable[tuple[bytes, bytes]], scrubber: Scrubber, counts: Counter[str]
) -> list[tuple[bytes, bytes]]:
    """Header (or trailer) names and values with the values taken out; counted into ``counts``."""
    clean = []
    for name, value in fields:
        name, in_name = scrubber.scrub(name)
        value, in_value = scrubber.scrub(value)
        counts.update(in_name + in_value)
        clean.append((name, value))
    return clean


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes, as a secret's bindings see it."""

    host: str
    port: int
    method: str
    path: str | None  # normalised; None when it has none
    over_tls: bool
    not_canonical: str | None  # why the raw path is no safe ground for a binding
    overrides: tuple[str, ...]  # methods a server may act on instead


def _route_of(request: http.Request, note: FlowNote, parts: Parts) -> Route:
    clean, not_canonical = _path_facts(request.data.path)
    return Route(
        note.host,
        request.port,
        request.method,
        clean,
        request.scheme == "https",
        not_canonical,
        tuple(_method_overrides(request, parts)),
    )


@functools.lru_cache(maxsize=1024)
def _path_facts(target: bytes) -> tuple[str | None, str | None]:
    """A request target's normalised path and why it is not canonical (see :class:`Route`): pure, and
    cached (an agent asks the same few paths over and over)."""
    return clean_path(target.decode("utf-8", "surrogateescape")), path_problem(target)


def _misplaced(secret: Secret, place: Place, parts: Parts) -> Refusal | None:
    """Why ``secret`` may not be in that part of a request, or None."""
    name = secret.name
    if place == "path":
        return Refusal(name, place, f"secret {name} may not be sent in a URL's path")
    if place in ("method", "header-name"):
        return Refusal(name, place, f"secret {name} may not be sent in a request's {place}")
    location, _, header = place.partition(":")
    if location not in secret.locations:
        return Refusal(
            name, location, f"secret {name} may not be sent in the {location} (only: {', '.join(secret.locations)})"
        )
    if header:
        return Refusal(
            name, location, f"secret {name} may not be sent in the {header} header (only in credential headers)"
        )
    if place == "body" and parts.kind is None:
        return Refusal(name, place, f"secret {name} cannot be put in a body of type {parts.media}")
    return None


def _misrouted(secret: Secret, place: Place, route: Route) -> Refusal | None:
    """Why ``secret`` may not go where the request goes, or None."""
    name = secret.name
    if not route.over_tls:
        return Refusal(name, place, f"secret {name} is sent only over HTTPS")
    if route.not_canonical is not None:
        return Refusal(name, place, f"secret {name} is not sent: {route.not_canonical}")
    path = route.path
    if path is None or not secret.binds(route.host, route.port, route.method, path):
        reason = f"secret {name} is not bound to {route.method} {route.host}:{route.port}{path or ''}"
        return Refusal(name, place, reason)
    for method in route.overrides:
        if not secret.binds(route.host, route.port, method, path):
            return Refusal(name, place, f"secret {name} is not bound to {method} (asked for by a method override)")
    return None


_OVERRIDE_NAMES = frozenset(name.encode() for name in METHOD_OVERRIDES)


def _method_overrides(request: http.Request, parts: Parts) -> list[str]:
    """The methods a server may act on instead of the request line's (override headers, ``_method``)."""
    methods = [value.decode("latin-1") for name, value in request.headers.fields if name.lower() in _OVERRIDE_NAMES]
    fields = urllib.parse.parse_qsl(parts.query.decode("latin-1"), keep_blank_values=True) if parts.query else []
    if parts.kind == "form" and parts.body:
        fields += urllib.parse.parse_qsl(parts.body.decode("latin-1"), keep_blank_values=True)
    methods += [value for name, value in fields if name == METHOD_FIELD]
    return [method.strip().upper() for method in methods]


def _parts(request: http.Request) -> Parts:
    """The request's parts; raises ValueError when its body cannot be decoded (DecodedTooLarge past the cap)."""
    path, _, query = request.data.path.partition(b"?")
    headers = list(request.headers.fields)
    basic = []
    for index, (name, value) in enumerate(headers):
        credentials = basic_credentials(value) if name.lower() == b"authorization" else None
        if credentials is not None:
            basic.append((index, credentials))
    raw = request.raw_content or b""
    body = decoded(raw, _header(headers, b"content-encoding"))
    media = _header(headers, b"content-type", "none")
    return Parts(path, query, headers, basic, body, body_type(media), media, request.data.method)


def _fill(
    data: bytes,
    secrets: set[Secret],
    location: Location,
    counts: Counter[tuple[str, str]],
    kind: BodyType | None = None,
) -> bytes:
    """``data`` with each secret's placeholder replaced by its value, encoded for the place; how many
    counted into ``counts`` by secret and place. ``data`` itself when it holds none."""
    if PLACEHOLDER_PREFIX_BYTES not in data:  # most headers: no look per secret
        return data
    for secret in secrets:
        placeholder = secret.placeholder.encode()
        if secret.value is not None and placeholder in data:
            counts[secret.name, location] += data.count(placeholder)
            data = data.replace(placeholder, encoded_for(secret.value, location, kind))
    return data


def _substitute(request: http.Request, parts: Parts, secrets: set[Secret]) -> Counter[tuple[str, str]]:
    """The values put in the request in place of their placeholders; how many, by secret and place."""
    counts: Counter[tuple[str, str]] = Counter()
    query = _fill(parts.query, secrets, "query", counts)
    if query is not parts.query:
        request.data.path = parts.path + b"?" + query
    basic = dict(parts.basic)
    fields = []
    for index, (name, value) in enumerate(parts.headers):
        if index in basic:
            credentials = _fill(basic[index], secrets, "basic", counts)
            value = basic_header(credentials) if credentials is not basic[index] else value
        else:
            value = _fill(value, secrets, "header", counts)
        fields.append((name, value))
    request.headers.fields = tuple(fields)
    body = _fill(parts.body, secrets, "body", counts, parts.kind)
    if body is not parts.body:
        request.content = body  # encoded again as its Content-Encoding says
    return counts


def _scrub_request(request: http.Request, book: SecretBook) -> None:
    """The values taken out of a refused request (it goes nowhere, but it is recorded)."""
    scrubber = book.scrubber
    request.data.path = scrubber.scrub(request.data.path)[0]
    request.headers = http.Headers([(name, scrubber.scrub(value)[0]) for name, value in request.headers.fields])
    if request.raw_content:
        request.content = scrubber.scrub(request.get_content(strict=False) or b"")[0]


def _close_client(flow: http.HTTPFlow) -> None:
    """Close the client connection of ``flow`` at once: its state is closed before mitmproxy's
    next command, so nothing more is written to it. mitmproxy's WebSocket layer ignores a killed
    flow (it only drops the message), its answer validation sends its own 502 page whatever the
    error hook did, and it has no public way for an addon to close a connection (mitmproxy#4773):
    so this asks the connection's handler in the ``proxyserver`` addon, as mitmproxy's own
    ``inject`` commands find it. With no such handler (a test harness) nothing is closed."""
    server = ctx.master.addons.get("proxyserver")  # type: ignore[no-untyped-call,unused-ignore]
    handlers = getattr(server, "connections", None)
    handler = handlers.get(flow.client_conn.id) if isinstance(handlers, dict) else None
    close = getattr(handler, "close_connection", None)
    if callable(close):
        close(flow.client_conn)
