"""The egress proxy's brokered secrets, pure: the live set, where a request may carry each one, its
substitution per location, and the scrubbing of values an answer hands back.

Stdlib only (with :mod:`corral.proxy.policy` and :mod:`corral.contracts.placeholders`): the addon
(:mod:`corral.proxy.addons.broker`) reads a flow into bytes and calls these.

A value is looked for in every form a request or an answer can put it in (:func:`value_forms`):
plain, percent-encoded (``quote`` and ``quote_plus``), JSON-escaped, HTML-escaped and base64
(standard and URL-safe, at each of the three alignments a value can take inside a longer base64
text). The forms are made once per change of the set, longest first; a scan is one ``in`` per form
(measured 13x faster on 1 MB than one alternation pattern of the same forms).
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import os
import re
import urllib.parse
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from corral.contracts.placeholders import (
    LOCATIONS,
    PLACEHOLDER,
    PLACEHOLDER_BYTES,
    Location,
    name_problem,
    value_digest,
)
from corral.errors import DecodedTooLarge, ErrorCode, InvalidMessage
from corral.proxy.policy import Rule, normalize_path, parse_rule
from corral.proxy.unescape import LEADS, Decoder, find_all, original_span

SECRETS_FILE = "secrets.json"  # names, placeholders, bindings, generation; never a value

BodyType = Literal["form", "json", "multipart", "text"]


# A secret as persisted (never its value): its name, placeholder and bindings (``in``: a keyword).
SecretMetadata = TypedDict("SecretMetadata", {"name": str, "placeholder": str, "allow": list[str], "in": list[str]})


class SecretsState(TypedDict):
    """What the ``secrets`` reply and ``status`` carry of the live set."""

    generation: int
    names: list[str]
    loaded: bool
    digests: NotRequired[dict[str, str]]  # name -> keyed digest of the value held, for the gateway


@dataclass(frozen=True, slots=True)
class Secret:
    """One brokered secret. ``value`` is None when it is not loaded (a restarted proxy knows its
    placeholder and bindings from secrets.json, not its value, until the gateway sends it again)."""

    name: str
    placeholder: str
    value: bytes | None = field(repr=False)  # never in a repr, a log line or a record
    allow: tuple[Rule, ...]
    locations: tuple[Location, ...]

    def binds(self, host: str, port: int, method: str, path: str) -> bool:
        """Whether a bound rule covers the request (``path`` already normalised); a rule's path
        prefix covers whole segments only (``/v1`` covers ``/v1`` and ``/v1/x``, not ``/v1admin``)."""
        return any(
            rule.matches_host(host, port)
            and rule.matches_request(method, path)
            and (rule.path_prefix is None or _on_boundary(rule.path_prefix, path))
            for rule in self.allow
        )

    def bindings(self) -> dict[str, list[str]]:
        return {"allow": self._allowed(), "in": list(self.locations)}

    def metadata(self) -> SecretMetadata:
        name, placeholder = self.name, self.placeholder
        return {"name": name, "placeholder": placeholder, "allow": self._allowed(), "in": list(self.locations)}

    def _allowed(self) -> list[str]:
        return [str(rule) for rule in self.allow]


def _on_boundary(prefix: str, path: str) -> bool:
    rest = path[len(prefix) :]
    return prefix.endswith("/") or not rest or rest[0] in "/?"


def secret_from(name: str, placeholder: str, value: bytes | None, allow: Iterable[str], where: Iterable[str]) -> Secret:
    """A secret from its wire (or persisted) form; raises ValueError naming what is wrong."""
    problem = name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    if PLACEHOLDER.fullmatch(placeholder) is None:
        raise ValueError("a placeholder is corral_secret_ and 32 lowercase hex digits")
    locations = tuple(dict.fromkeys(where))
    if not locations or not set(locations) <= set(LOCATIONS):
        raise ValueError(f"'in' is a non-empty list of {', '.join(LOCATIONS)}")
    return Secret(name, placeholder, value, tuple(parse_rule(entry) for entry in allow), locations)  # type: ignore[arg-type]


# -- forms of a value ----------------------------------------------------------------------------

# Characters an HTML or JSON encoder may write as a numeric escape.
_HTML_SPECIAL = "&<>\"'"
_GO_JSON = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}  # Go's encoding/json by default


def _escaped(text: str, escape: Callable[[str], str], which: Callable[[str], bool]) -> bytes:
    return "".join(escape(char) if which(char) else char for char in text).encode("utf-8", "surrogateescape")


def _json_char(char: str) -> str:
    return json.dumps(char)[1:-1] if ord(char) > 0x7F else f"\\u{ord(char):04x}"


def _special(char: str) -> bool:
    return char in _HTML_SPECIAL


def _not_alphanumeric(char: str) -> bool:
    return not (char.isascii() and char.isalnum())


def text_forms(value: bytes) -> set[bytes]:
    """The forms of ``value`` whose letter case an encoder may change (percent and hex digits,
    entity names): matched in any case."""
    text = value.decode("utf-8", "surrogateescape")
    json_text = json.dumps(text)[1:-1]
    forms = {
        value,
        value.hex().encode(),
        urllib.parse.quote(value, safe="").encode(),
        urllib.parse.quote(value).encode(),
        urllib.parse.quote_plus(value).encode(),
        urllib.parse.quote(value, safe="!'()*").encode(),  # JavaScript's encodeURIComponent
        json_text.encode(),
        json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8", "surrogateescape"),
        json_text.replace("/", "\\/").encode(),
        "".join(_GO_JSON.get(char, char) for char in json_text).encode(),
        _escaped(text, _json_char, _not_alphanumeric),
        html.escape(text).encode("utf-8", "surrogateescape"),
        html.escape(text).replace("&#x27;", "&#39;").replace("&quot;", "&#34;").encode("utf-8", "surrogateescape"),
        html.escape(text).replace("&#x27;", "&#039;").encode("utf-8", "surrogateescape"),  # PHP's htmlspecialchars
    }
    for numeric in (lambda char: f"&#{ord(char)};", lambda char: f"&#x{ord(char):x};"):
        forms.add(_escaped(text, numeric, _special))
        forms.add(_escaped(text, numeric, _not_alphanumeric))
    return forms


def base64_forms(value: bytes) -> set[bytes]:
    """The part of a base64 text that only the value's bytes decide, at each of the three
    alignments, standard and URL-safe: matched as they are (base64 is case-sensitive)."""
    forms = set()
    for offset in range(3):
        skip = (3 - offset) % 3
        whole = (len(value) - skip) // 3 * 3
        core = value[skip : skip + whole]
        if core:
            forms.add(base64.b64encode(core).rstrip(b"="))
            forms.add(base64.urlsafe_b64encode(core).rstrip(b"="))
    return forms


def value_forms(value: bytes) -> set[bytes]:
    """Every form of ``value`` looked for in requests and answers."""
    return text_forms(value) | base64_forms(value)


def _unwrapped(data: bytes) -> bytes:
    """``data`` with its line breaks, raw or JSON-escaped (MIME, PEM and GitHub's contents API
    wrap base64), taken out."""
    if b"\n" in data or b"\r" in data:
        data = data.translate(None, b"\r\n")
    for escaped in (b"\\n", b"\\r"):
        if escaped in data:
            data = data.replace(escaped, b"")
    return data


def _wrapped_pattern(form: bytes) -> re.Pattern[bytes]:
    """``form`` with any line breaks between its characters."""
    breaks = b"(?:\\\\[rn]|[\r\n])*"
    return re.compile(breaks.join(re.escape(form[i : i + 1]) for i in range(len(form))))


_ANCHOR_MIN = 6  # shorter runs of letters and digits than this prefilter nothing worth it


def anchor_of(value: bytes) -> bytes | None:
    """The longest run of ASCII letters and digits in ``value``, lowercased: every text form but hex
    keeps it as it is (escapes change only the other characters), so where it is absent none of
    them can be. None when too short to be worth a look of its own."""
    runs = re.findall(rb"[A-Za-z0-9]+", value)
    longest = max(runs, key=len, default=b"")
    return longest.lower() if len(longest) >= _ANCHOR_MIN else None


class Scrubber:
    """The forms of every loaded value, each with the secret it belongs to. Text forms are looked
    for in the lowercased data, behind their value's anchor (one ``in`` for a value's escaped
    forms, see :func:`anchor_of`); base64 forms in the data with its line breaks taken out. A scan
    is two copies of the data and a few ``in`` per value (one alternation pattern of the same forms
    measured 13x slower on 1 MB); only a form found is replaced, longest first (a form inside a
    longer one is found as the longer)."""

    def __init__(self, secrets: Iterable[Secret]) -> None:
        secrets = tuple(secrets)
        seen: set[bytes] = set()
        anchored: dict[bytes, list[tuple[bytes, Secret]]] = {}
        always: list[tuple[bytes, Secret]] = []
        exact: list[tuple[bytes, Secret]] = []
        for secret in secrets:
            if secret.value is None:
                continue
            anchor = anchor_of(secret.value)
            for form in sorted(text_forms(secret.value)):
                form = form.lower()
                if form not in seen:
                    seen.add(form)
                    inside = anchor is not None and anchor in form
                    (anchored.setdefault(anchor, []) if inside and anchor else always).append((form, secret))
            for form in sorted(base64_forms(secret.value)):
                if form not in seen:
                    seen.add(form)
                    exact.append((form, secret))
        self.anchored = {anchor: _longest_first(forms) for anchor, forms in anchored.items()}
        self.always = _longest_first(always)
        self.exact = _longest_first(exact)
        self.forms = _longest_first([*always, *exact, *(f for forms in anchored.values() for f in forms)])
        # What the canonical pass looks for in decoded text: each value in any case, its base64 forms as
        # they are (base64 in a URL has its + / = percent-escaped), longest first.
        decoded_forms = [(s.value.lower(), s, True) for s in secrets if s.value is not None]
        decoded_forms += [(form, s, False) for form, s in exact]
        self.decoded_forms = sorted(decoded_forms, key=lambda item: len(item[0]), reverse=True)

    def __bool__(self) -> bool:
        return bool(self.forms)

    def _folded_in(self, lowered: bytes) -> Iterator[tuple[bytes, Secret]]:
        for form, secret in self.always:
            if form in lowered:
                yield form, secret
        for anchor, forms in self.anchored.items():
            if anchor in lowered:
                for form, secret in forms:
                    if form in lowered:
                        yield form, secret

    def _exact_in(self, flat: bytes) -> Iterator[tuple[bytes, Secret]]:
        for form, secret in self.exact:
            if form in flat:
                yield form, secret

    def first(self, data: bytes) -> Secret | None:
        """The secret one of whose values' forms ``data`` holds, or None."""
        lowered = data.lower()
        for _, secret in self._folded_in(lowered):
            return secret
        if self.exact:
            for _, secret in self._exact_in(_unwrapped(data)):
                return secret
        for _, _, secret in self._escaped_in(data, first=True):
            return secret
        return None

    def scrub(self, data: bytes) -> tuple[bytes, Counter[str]]:
        """``data`` with every form of a value replaced by its placeholder; how many, by secret."""
        counts: Counter[str] = Counter()
        lowered = data.lower()
        folded = _longest_first(list(self._folded_in(lowered)))
        for form, secret in folded:
            pattern = re.compile(re.escape(form), re.IGNORECASE)
            data, found = pattern.subn(secret.placeholder.encode(), data)
            counts[secret.name] += found
        if self.exact:
            for form, secret in _longest_first(list(self._exact_in(_unwrapped(data)))):
                pattern = _wrapped_pattern(form) if form not in data else re.compile(re.escape(form))
                data, found = pattern.subn(secret.placeholder.encode(), data)
                counts[secret.name] += found
        spans = self._escaped_in(data)
        if spans:
            data = _replaced(data, spans, counts)
        return data, +counts

    def _escaped_in(self, data: bytes, first: bool = False) -> list[tuple[int, int, Secret]]:
        """The spans of ``data`` that show a value once their escapes are decoded (JSON, HTML, percent;
        some characters escaped and others not, or all of them), widened to whole escapes, joined
        where they overlap; with ``first``, the first one found, unmapped. Empty when ``data`` has
        no escape (one ``in`` per kind). A value is looked for in the last layer decoded, and in
        those before only when it holds an escape's lead (decoding further could change it)."""
        layers = Decoder().layers(data)
        found: list[tuple[int, int, Secret]] = []
        for depth, layer in enumerate(layers):
            last = depth == len(layers) - 1
            text = layer.text
            lowered = text.lower()
            for form, secret, folded in self.decoded_forms:
                if not last and not any(lead in form for lead in LEADS):
                    continue
                for start, end in find_all(lowered if folded else text, form):
                    if first:
                        return [(start, end, secret)]
                    found.append((*original_span(layers, depth, start, end), secret))
        return _joined(found)


def _joined(spans: list[tuple[int, int, Secret]]) -> list[tuple[int, int, Secret]]:
    """Spans sorted, overlapping ones joined (the first one's secret kept)."""
    out: list[tuple[int, int, Secret]] = []
    for start, end, secret in sorted(spans, key=lambda span: (span[0], -span[1])):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(end, out[-1][1]), out[-1][2])
        else:
            out.append((start, end, secret))
    return out


def _replaced(data: bytes, spans: list[tuple[int, int, Secret]], counts: Counter[str]) -> bytes:
    """``data`` with each (sorted, disjoint) span replaced by its secret's placeholder; counted."""
    pieces, at = [], 0
    for start, end, secret in spans:
        pieces += [data[at:start], secret.placeholder.encode()]
        counts[secret.name] += 1
        at = end
    pieces.append(data[at:])
    return b"".join(pieces)


def _longest_first(forms: Iterable[tuple[bytes, Secret]]) -> tuple[tuple[bytes, Secret], ...]:
    return tuple(sorted(forms, key=lambda item: len(item[0]), reverse=True))


# -- the live set --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """What one ``secrets`` message does to the set (what its audit record says), and the set after."""

    generation: int
    secrets: tuple[Secret, ...]
    revoked_placeholders: Mapping[str, str]  # placeholder -> name, every one ever revoked
    added: list[str]
    rotated: list[str]
    revoked: list[str]
    restored: list[str]

    def bindings(self) -> dict[str, dict[str, list[str]]]:
        return {secret.name: secret.bindings() for secret in self.secrets}


class SecretBook:
    """The session's secrets as the proxy holds them, with what recognising them needs."""

    def __init__(self) -> None:
        self.generation = 0
        self.secrets: dict[str, Secret] = {}
        self.revoked: dict[str, str] = {}  # placeholder -> name
        # Values no longer live (revoked, or a rotated secret's old one), each with its secret's name
        # and placeholder: revoking in Corral revokes nothing at the provider, and a host that stored
        # one may hand it back. In memory only (never persisted): gone when the proxy restarts.
        self.retired: dict[bytes, Secret] = {}
        self._rebuild()

    def _rebuild(self) -> None:
        self.by_placeholder: dict[bytes, Secret] = {s.placeholder.encode(): s for s in self.secrets.values()}
        self.revoked_bytes = {placeholder.encode(): name for placeholder, name in self.revoked.items()}
        self.known = self.by_placeholder.keys() | self.revoked_bytes.keys()  # this session's placeholders
        # Live values first: a value both live and retired (rotated back) is scrubbed as the live one.
        self.scrubber = Scrubber([*self.secrets.values(), *self.retired.values()])
        self.loaded = all(secret.value is not None for secret in self.secrets.values())
        self._bound_hosts: dict[tuple[str, int], tuple[str, ...]] = {}
        # Nothing to find in a request: every hook returns at once.
        self.active = bool(self.secrets or self.revoked)

    def bound_to(self, host: str, port: int) -> tuple[str, ...]:
        """The names of the secrets bound to ``host``:``port`` (by any of their rules), cached until
        the set changes."""
        key = (host, port)
        names = self._bound_hosts.get(key)
        if names is None:
            names = tuple(
                secret.name
                for secret in self.secrets.values()
                if any(rule.matches_host(host, port) for rule in secret.allow)
            )
            self._bound_hosts[key] = names
        return names

    def state(self, key: str = "") -> SecretsState:
        """What the ``secrets`` reply and ``status`` carry; with ``key`` (the gateway's control token),
        each loaded value's keyed digest too, so the gateway knows which value the proxy holds."""
        state: SecretsState = {"generation": self.generation, "names": sorted(self.secrets), "loaded": self.loaded}
        if key:
            state["digests"] = {
                name: value_digest(key, secret.value)
                for name, secret in sorted(self.secrets.items())
                if secret.value is not None
            }
        return state

    def plan(self, incoming: Sequence[Secret]) -> Change:
        """What setting the live set to ``incoming`` changes; raises InvalidMessage when a name's
        placeholder would change, a revoked placeholder come back or a placeholder be another
        name's. A secret sent without a value keeps the one held (if any)."""
        self._check_owners(incoming)
        secrets: list[Secret] = []
        added, rotated, restored = [], [], []
        for secret in incoming:
            held = self.secrets.get(secret.name)
            field_name = f"secrets.{secret.name}.placeholder"
            if secret.placeholder in self.revoked:
                raise InvalidMessage(ErrorCode.INVALID_FIELD, f"{secret.name}'s placeholder was revoked", field_name)
            if held is None:
                added.append(secret.name)
            elif held.placeholder != secret.placeholder:
                raise InvalidMessage(ErrorCode.INVALID_FIELD, f"{secret.name}'s placeholder may not change", field_name)
            elif secret.value is None:
                secret = Secret(secret.name, secret.placeholder, held.value, secret.allow, secret.locations)
            elif held.value is None:
                restored.append(secret.name)
            elif held.value != secret.value:
                rotated.append(secret.name)
            secrets.append(secret)
        names = {secret.name for secret in secrets}
        gone = [s for s in self.secrets.values() if s.name not in names]
        revoked_placeholders = {**self.revoked, **{s.placeholder: s.name for s in gone}}
        return Change(
            self.generation + 1,
            tuple(secrets),
            revoked_placeholders,
            added,
            rotated,
            [s.name for s in gone],
            restored,
        )

    def _check_owners(self, incoming: Sequence[Secret]) -> None:
        """Raises InvalidMessage when a placeholder would be another name's: one live now (or revoked
        by this very message), or another in the message. One placeholder, one secret, for good."""
        holders = {s.placeholder: s.name for s in self.secrets.values()}
        for secret in incoming:
            holder = holders.setdefault(secret.placeholder, secret.name)
            if holder != secret.name:
                field_name = f"secrets.{secret.name}.placeholder"
                reason = (
                    f"{secret.name}'s placeholder is live secret {holder}'s"
                    if holder in self.secrets
                    else f"{secret.name}'s placeholder is given to {holder} too in this message"
                )
                raise InvalidMessage(ErrorCode.INVALID_FIELD, reason, field_name)

    def apply(self, change: Change) -> None:
        self._retire(change)
        self.generation = change.generation
        self.secrets = {secret.name: secret for secret in change.secrets}
        self.revoked = dict(change.revoked_placeholders)
        self._rebuild()

    def _retire(self, change: Change) -> None:
        """Keeps the values ``change`` takes out of the live set (revoked or rotated)."""
        after = {secret.name: secret.value for secret in change.secrets}
        for secret in self.secrets.values():
            if secret.value is not None and after.get(secret.name) != secret.value:
                self.retired[secret.value] = Secret(secret.name, secret.placeholder, secret.value, (), ())

    def persist(self, path: Path, change: Change) -> None:
        """The metadata after ``change`` (never a value), readable by the proxy's user only."""
        data = {
            "generation": change.generation,
            "secrets": [secret.metadata() for secret in change.secrets],
            "revoked": change.revoked_placeholders,
        }
        temporary = path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(temporary, path)

    def restore(self, path: Path) -> bool:
        """The metadata persisted in ``path``, values not loaded; False when there is none. Raises
        ValueError (or OSError) when it cannot be read."""
        if not path.exists():
            return False
        stored = json.loads(path.read_text())
        secrets = [
            secret_from(str(s["name"]), str(s["placeholder"]), None, list(s["allow"]), list(s["in"]))
            for s in stored.get("secrets", [])
        ]
        revoked = {str(placeholder): str(name) for placeholder, name in dict(stored.get("revoked", {})).items()}
        self.generation = int(stored.get("generation", 0))
        self.secrets = {secret.name: secret for secret in secrets}
        self.revoked = revoked
        self._rebuild()
        return True


# -- a request's parts ---------------------------------------------------------------------------


def placeholders_in(data: bytes) -> list[bytes]:
    """The placeholder-shaped strings in ``data`` (this session's or not), each once."""
    return list(dict.fromkeys(PLACEHOLDER_BYTES.findall(data)))


def without_placeholders(data: bytes) -> bytes:
    """``data`` with the placeholders cut out (a value that happens to be part of one is no leak)."""
    return PLACEHOLDER_BYTES.sub(b"", data) if b"corral_secret_" in data else data


def body_type(content_type: str) -> BodyType | None:
    """How a body of this media type carries a secret, or None when it cannot."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/x-www-form-urlencoded":
        return "form"
    if media == "application/json" or media.endswith("+json"):
        return "json"
    if media.startswith("multipart/"):
        return "multipart"
    if media.startswith("text/"):
        return "text"
    return None


def encoded_for(value: bytes, location: Location | Literal["path"], kind: BodyType | None = None) -> bytes:
    """The value as it must be written in that place."""
    if location == "query":
        return urllib.parse.quote(value, safe="").encode()
    if location == "body" and kind == "form":
        return urllib.parse.quote_plus(value).encode()
    if location == "body" and kind == "json":
        return json.dumps(value.decode("utf-8", "surrogateescape"))[1:-1].encode()
    return value  # header, basic (encoded around it), multipart and text bodies: raw


def basic_credentials(header: bytes) -> bytes | None:
    """The decoded ``user:password`` of an ``Authorization: Basic`` header, or None."""
    scheme, _, token = header.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        return base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def basic_header(credentials: bytes) -> bytes:
    return b"Basic " + base64.b64encode(credentials)


def clean_path(path: str) -> str | None:
    """The normalised path a binding is matched against, or None when it has none."""
    try:
        return normalize_path(path)
    except ValueError:
        return None


# Headers that make a server act on another method than the request line's.
METHOD_OVERRIDES = ("x-http-method-override", "x-http-method", "x-method-override")
METHOD_FIELD = "_method"  # the same as a query or form field (Rails, Laravel, Symfony)


def path_problem(target: bytes) -> str | None:
    """Why a request target is not canonical enough to carry a secret, or None. Servers and
    frameworks resolve dot segments, empty segments, ``;`` parameters, backslashes and fragments
    in different ways, so a binding's path holds only where they leave no doubt."""
    path = target.split(b"?", 1)[0]
    if b"#" in target:
        return "its URL holds a '#'"
    lowered = path.lower()
    if b"\\" in path or b"%5c" in lowered:
        return "its path holds a backslash"
    if b"%2f" in lowered:
        return "its path holds an encoded slash"
    if not path.startswith(b"/"):
        return "its path does not start with '/'"
    segments = path.split(b"/")[1:]
    for index, segment in enumerate(segments):
        if not segment and index < len(segments) - 1:
            return "its path holds an empty segment ('//')"
        if b";" in segment:
            return "its path holds a ';' parameter"
        if urllib.parse.unquote_to_bytes(segment) in (b".", b".."):
            return "its path holds a dot segment"
    return None


DECODED_CAP = 64 * 1024 * 1024  # the most a body is decoded to, to be read for secrets
GZIP_WBITS = 16 + zlib.MAX_WBITS


def decoded(raw: bytes, encoding: str, cap: int = DECODED_CAP) -> bytes:
    """``raw`` decoded per its Content-Encoding, never to more than ``cap`` bytes (DecodedTooLarge);
    raises ValueError when it cannot be decoded."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity", "none"):
        body = raw
    elif encoding in ("gzip", "x-gzip"):
        body = _inflate(raw, GZIP_WBITS, cap)
    elif encoding == "deflate":
        try:
            body = _inflate(raw, zlib.MAX_WBITS, cap)
        except ValueError:
            body = _inflate(raw, -zlib.MAX_WBITS, cap)  # raw deflate, as some servers send it
    elif encoding == "br":
        body = _unbrotli(raw, cap)
    elif encoding == "zstd":
        body = _unzstd(raw, cap)
    else:
        raise ValueError(f"unknown content encoding {encoding!r}")
    if len(body) > cap:
        limit = f"{cap // (1024 * 1024)} MiB" if cap >= 1024 * 1024 else f"{cap} bytes"
        raise DecodedTooLarge(f"it decodes to more than {limit}")
    return body


def _inflate(raw: bytes, wbits: int, cap: int) -> bytes:
    """Every member (gzip) or stream (deflate) of ``raw``, one after the other, as a client that reads
    them all (gunzip, urllib3, the agent's own code) does: a value in a second member is read too.
    Bytes after the last one that are no member are ValueError (never passed unread); a deflate
    stream after the first may come with or without its zlib wrapper."""
    out = bytearray()
    while True:
        body, rest = _inflate_one(raw, wbits, cap + 1 - len(out))
        out += body
        if len(out) > cap or not rest:
            return bytes(out)
        raw = rest
        if wbits != GZIP_WBITS:
            wbits = zlib.MAX_WBITS if _zlib_header(raw) else -zlib.MAX_WBITS


def _zlib_header(data: bytes) -> bool:
    """Whether ``data`` starts as a zlib stream does (RFC 1950: deflate, and a check that holds)."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


def _inflate_one(raw: bytes, wbits: int, room: int) -> tuple[bytes, bytes]:
    """One member (stream) of ``raw``, decoded to at most ``room`` bytes, and the bytes after it."""
    decompressor = zlib.decompressobj(wbits)
    try:
        body = decompressor.decompress(raw, room)
    except zlib.error as exc:
        raise ValueError(str(exc)) from exc
    if len(body) >= room:
        return body, b""  # past the cap: the caller says so
    if not decompressor.eof:
        raise ValueError("truncated")
    return body, decompressor.unused_data


BROTLI_CHUNK = 1024  # input fed at a time to a brotli older than 1.2 (no output limit there)


def _unbrotli(raw: bytes, cap: int) -> bytes:
    import brotli  # type: ignore[import-not-found,import-untyped,unused-ignore]  # mitmproxy's own dependency

    decompressor = brotli.Decompressor()
    try:
        try:
            out: bytes = decompressor.process(raw, output_buffer_limit=cap + 1)
        except TypeError:
            # brotli < 1.2 (the dev venv's): fed in small pieces and checked after each; one piece
            # can still expand a lot, the image's brotli (1.2) takes the limit above.
            out = _unbrotli_pieces(decompressor, raw, cap)
    except brotli.error as exc:
        raise ValueError(str(exc)) from exc
    if len(out) <= cap and not decompressor.is_finished():
        raise ValueError("truncated")
    return out


def _unbrotli_pieces(decompressor: Any, raw: bytes, cap: int) -> bytes:
    out = bytearray()
    for start in range(0, len(raw), BROTLI_CHUNK):
        out += decompressor.process(raw[start : start + BROTLI_CHUNK])
        if len(out) > cap:
            break
    return bytes(out)


def _unzstd(raw: bytes, cap: int) -> bytes:
    try:  # what mitmproxy 12 uses (Python 3.14's compression.zstd, backported)
        from backports import zstd  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return _unzstandard(raw, cap)
    out = bytearray()
    try:
        while raw and len(out) <= cap:  # frame by frame
            decompressor = zstd.ZstdDecompressor()
            out += decompressor.decompress(raw, max_length=cap + 1 - len(out))
            if len(out) <= cap and not decompressor.eof:
                raise ValueError("truncated")
            raw = decompressor.unused_data
    except zstd.ZstdError as exc:
        raise ValueError(str(exc)) from exc
    return bytes(out)


def _unzstandard(raw: bytes, cap: int) -> bytes:
    import zstandard  # type: ignore[import-not-found,import-untyped,unused-ignore]  # mitmproxy 11's

    try:
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as reader:
            body: bytes = reader.read(cap + 1)
    except zstandard.ZstdError as exc:
        raise ValueError(str(exc)) from exc
    return body
