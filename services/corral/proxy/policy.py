"""The per-session egress policy: deny by default, an allowlist, and a global deny on top.

Allowlist entries: ``[METHODS ]host[:port][/path-prefix]``, for example ``example.com``,
``*.example.com`` (subdomains, not the apex), ``api.example.com:8443``,
``GET,HEAD docs.example.com/guide/``. The global deny (loopback, private, link-local, metadata,
multicast and other special addresses, and names such as ``localhost``) wins over the allowlist
unless the operator allows private addresses. It holds in every mode: report mode relaxes only the
allowlist (:data:`REPORTABLE_RULES`), never the global deny.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

from corral.proxy.hosts import IPAddress, normalize_host, parse_ip

DENIED_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/96",  # the unspecified address and IPv4-compatible addresses
        "::1/128",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "fec0::/10",
        "100::/64",
        "2001:db8::/32",
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
    )
)
DENIED_NAMES = frozenset(
    {"localhost", "metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"}
)
DENIED_SUFFIXES = (".localhost", ".internal", ".local")
# Public DNS-over-HTTPS resolvers: a DoH lookup would let a page resolve names the proxy never sees.
DOH_NAMES = frozenset(
    {
        "dns.google",
        "dns.google.com",
        "dns64.dns.google",
        "cloudflare-dns.com",
        "mozilla.cloudflare-dns.com",
        "chrome.cloudflare-dns.com",
        "security.cloudflare-dns.com",
        "family.cloudflare-dns.com",
        "one.one.one.one",
        "1dot1dot1dot1.cloudflare-dns.com",
        "dns.quad9.net",
        "dns9.quad9.net",
        "dns10.quad9.net",
        "dns11.quad9.net",
        "doh.opendns.com",
        "doh.familyshield.opendns.com",
        "dns.nextdns.io",
        "doh.cleanbrowsing.org",
        "dns.adguard.com",
        "dns.adguard-dns.com",
        "doh.dns.sb",
        "dns.alidns.com",
        "doh.pub",
        "dns.controld.com",
        "freedns.controld.com",
        "doh.mullvad.net",
        "dns.mullvad.net",
    }
)
DOH_MEDIA_TYPES = ("application/dns-message", "application/dns-json")
WEB_PORTS = (80, 443)  # what a rule without a port allows
ALLOWLIST_RULE = "default-deny"  # the rule of a refusal by the allowlist (nothing on it matched)
# What report mode may let through (and log as "report"): only the allowlist's own refusals. The
# global deny (the proxy itself, loopback, private, link-local, metadata, DoH), unparseable hosts and
# paths, and protocol violations are refused in every mode: a report-mode session is a way to learn
# which hosts an agent needs, never a way into the host's or the cloud's private networks.
REPORTABLE_RULES = frozenset({ALLOWLIST_RULE})
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})


@dataclass(frozen=True, slots=True)
class Rule:
    host: str
    wildcard: bool = False
    port: int | None = None
    methods: frozenset[str] | None = None
    path_prefix: str | None = None

    def __str__(self) -> str:
        methods = ",".join(sorted(self.methods)) + " " if self.methods else ""
        host = f"*.{self.host}" if self.wildcard else self.host
        port = f":{self.port}" if self.port is not None else ""
        return f"{methods}{host}{port}{self.path_prefix or ''}"

    def matches_host(self, host: str, port: int) -> bool:
        if port != self.port if self.port is not None else port not in WEB_PORTS:
            return False
        return host.endswith("." + self.host) if self.wildcard else host == self.host

    def matches_request(self, method: str, path: str) -> bool:
        """``path`` must already be normalised (see :func:`normalize_path`)."""
        if self.methods is not None and method.upper() not in self.methods:
            return False
        return self.path_prefix is None or path.startswith(self.path_prefix)


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    rule: str | None = None


def parse_rule(text: str) -> Rule:
    """One allowlist entry; raises ValueError naming what is wrong."""
    entry = text.strip()
    methods: frozenset[str] | None = None
    if " " in entry:
        method_text, _, entry = entry.partition(" ")
        methods = frozenset(m.strip().upper() for m in method_text.split(",") if m.strip())
        unknown = methods - METHODS
        if not methods or unknown:
            raise ValueError(f"unknown method(s) {sorted(unknown)} in {text!r}")
        entry = entry.strip()
    path: str | None = None
    if "/" in entry:
        entry, slash, rest = entry.partition("/")
        path = slash + rest
    port: int | None = None
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise ValueError(f"unclosed IPv6 bracket in {text!r}")
        host_text, port_text = entry[: close + 1], entry[close + 1 :].removeprefix(":")
    else:
        host_text, _, port_text = entry.partition(":")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"bad port {port_text!r} in {text!r}")
        port = int(port_text)
    wildcard = host_text.startswith("*.")
    if "*" in (host_text[2:] if wildcard else host_text):
        raise ValueError(f"a wildcard may only lead a host ('*.example.com'): {text!r}")
    host = normalize_host(host_text[2:] if wildcard else host_text)
    if wildcard and parse_ip(host) is not None:
        raise ValueError(f"a wildcard needs a domain, not an address: {text!r}")
    return Rule(host=host, wildcard=wildcard, port=port, methods=methods, path_prefix=path)


def globally_denied(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            return globally_denied(embedded)
    # Anything not globally routable (site-local, NAT64, documentation, ...) is out, beside the list.
    return not address.is_global or any(address in net for net in DENIED_NETWORKS if net.version == address.version)


def normalize_path(path: str) -> str:
    """The path a server will act on: percent-decoded unreserved bytes, dot segments resolved.

    Raises ValueError for an encoded slash or backslash, which servers disagree about.
    """
    raw = path.split("?", 1)[0].split("#", 1)[0] or "/"
    lowered = raw.lower()
    if "%2f" in lowered or "%5c" in lowered or "\\" in raw:
        raise ValueError(f"encoded or back slashes in the path: {raw!r}")
    decoded = urllib.parse.unquote(raw)
    segments: list[str] = []
    for segment in decoded.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment != ".":
            segments.append(segment)
    out = "/".join(segments)
    if not out.startswith("/"):
        out = "/" + out
    if decoded.endswith(("/", "/.", "/..")) and not out.endswith("/"):
        out += "/"
    return out


def is_doh_request(path: str, headers: Iterable[tuple[str, str]]) -> bool:
    """A DNS-over-HTTPS query by its shape (RFC 8484 media types, or GET /dns-query?dns=...)."""
    for name, value in headers:
        if name.lower() in ("content-type", "accept") and any(t in value.lower() for t in DOH_MEDIA_TYPES):
            return True
    base, _, query = path.partition("?")
    return base.rstrip("/").endswith(("/dns-query", "/resolve")) and any(
        part.split("=", 1)[0] in ("dns", "name") for part in query.split("&")
    )


class Policy:
    """Decisions for one session, applied in this order:

    1. ``own_hosts`` (the proxy's own names and addresses) and ``host_addresses`` (the gateway
       host's own, its bridges' among them): always refused, trusted networks or not;
    2. the global deny (private, loopback, metadata, ... and DoH resolvers), unless ``allow_private``
       (the operator's override) or the address lies in one of ``trusted_networks`` (upstreams the
       operator vouches for, such as an internal service);
    3. the allowlist; anything else is refused.
    """

    def __init__(
        self,
        allow: Iterable[str],
        *,
        allow_private: bool = False,
        trusted_networks: Iterable[str] = (),
        own_hosts: Iterable[str] = (),
        host_addresses: Iterable[str] = (),
    ) -> None:
        self.rules = tuple(parse_rule(entry) for entry in allow)
        self.allow_private = allow_private
        self.trusted_networks = tuple(ipaddress.ip_network(net, strict=False) for net in trusted_networks)
        self.own_hosts = frozenset(normalize_host(host) for host in own_hosts)
        self.host_addresses = frozenset(ipaddress.ip_address(address) for address in host_addresses)

    @property
    def allow(self) -> list[str]:
        return [str(rule) for rule in self.rules]

    def with_allow(self, allow: Iterable[str]) -> Policy:
        """The same operator settings with another allowlist (raises ValueError for a bad entry)."""
        policy = Policy(allow, allow_private=self.allow_private)
        policy.trusted_networks, policy.own_hosts = self.trusted_networks, self.own_hosts
        policy.host_addresses = self.host_addresses
        return policy

    def _gateway_host(self, address: IPAddress) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address in self.host_addresses

    def _trusted(self, address: IPAddress) -> bool:
        return any(address in net for net in self.trusted_networks if net.version == address.version)

    def _global(self, host: str) -> Decision | None:
        if host in self.own_hosts:
            return Decision(False, f"{host} is the egress proxy itself", "global-deny")
        address = parse_ip(host)
        if address is not None and self._gateway_host(address):
            return Decision(False, f"{host} is an address of the gateway's host", "global-deny")
        if address is not None:
            # The operator's override lifts the address part only; local names and DoH stay refused.
            if globally_denied(address) and not self.allow_private and not self._trusted(address):
                return Decision(False, f"{host} is a loopback, private, link-local or reserved address", "global-deny")
            return None
        if host in DENIED_NAMES or host.endswith(DENIED_SUFFIXES):
            return Decision(False, f"{host} is a local or metadata name", "global-deny")
        if host in DOH_NAMES:
            return Decision(False, f"{host} is a DNS-over-HTTPS resolver", "global-deny")
        return None

    def connect(self, raw_host: str, port: int) -> Decision:
        """At CONNECT (or the first request on a connection): before any DNS lookup or upstream dial."""
        try:
            host = normalize_host(raw_host)
        except ValueError as exc:
            return Decision(False, str(exc), "invalid-host")
        denied = self._global(host)
        if denied is not None:
            return denied
        for rule in self.rules:
            if rule.matches_host(host, port):
                return Decision(True, f"allowed by {rule}", str(rule))
        return Decision(False, f"{host}:{port} is not on the session's allowlist", ALLOWLIST_RULE)

    def request(self, raw_host: str, port: int, method: str, path: str) -> Decision:
        """For each request: host and port as for CONNECT, then methods and path prefixes."""
        first = self.connect(raw_host, port)
        if not first.allowed:
            return first
        host = normalize_host(raw_host)
        try:
            clean = normalize_path(path)
        except ValueError as exc:
            return Decision(False, str(exc), "invalid-path")
        for rule in self.rules:
            if rule.matches_host(host, port) and rule.matches_request(method, clean):
                return Decision(True, f"allowed by {rule}", str(rule))
        # The normalised path, never the query: reasons reach the log and the refusal page unredacted.
        return Decision(False, f"{method} {clean} on {host} is not allowed by the session's rules", ALLOWLIST_RULE)

    def resolved(self, host: str, address: str) -> Decision:
        """After the one DNS lookup: a name that resolves into the global deny is refused (and the
        vetted address is what the proxy then dials, so a rebinding cannot change it)."""
        parsed = parse_ip(address.split("%", 1)[0])
        if parsed is None:
            return Decision(False, f"{host} resolved to {address!r}, which is no address", "invalid-host")
        if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
            parsed = parsed.ipv4_mapped
        if str(parsed) in self.own_hosts:
            return Decision(False, f"{host} resolves to {parsed}, the egress proxy itself", "global-deny")
        if self._gateway_host(parsed):
            return Decision(False, f"{host} resolves to {parsed}, an address of the gateway's host", "global-deny")
        if not self.allow_private and globally_denied(parsed) and not self._trusted(parsed):
            return Decision(
                False, f"{host} resolves to {parsed}, a loopback, private or reserved address", "global-deny"
            )
        return Decision(True, f"{host} resolves to {parsed}")
