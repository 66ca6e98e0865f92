"""Host names and addresses as the policy compares them: one canonical form, or ValueError.

Normalises case, a trailing dot, IDN (to punycode) and every numeric IPv4 form that
``inet_aton`` accepts (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``), so no spelling of
an address slips past a rule.
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import re
import socket
import struct

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NUMERIC_V4 = re.compile(r"^[0-9a-fA-FxX.]+$")
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def parse_ip(host: str) -> IPAddress | None:
    """The address ``host`` spells, in any numeric form, or None for a name."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in text:
        if "%" in text:
            raise ValueError(f"IPv6 zone ids are not allowed: {host!r}")
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            raise ValueError(f"not an IPv6 address: {host!r}") from None
    if _NUMERIC_V4.match(text) and any(c.isdigit() for c in text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            # Looks numeric but is not an address (e.g. "1.2.3.4.5"): not a valid name either.
            if all(part.isdigit() for part in text.split(".") if part):
                raise ValueError(f"not a valid IPv4 address: {host!r}") from None
    return None


@functools.lru_cache(maxsize=4096)
def normalize_host(raw: str) -> str:
    """The canonical form of a host: an address's standard text, or a lower-case ASCII name."""
    host = raw.strip()
    if not host:
        raise ValueError("empty host")
    address = parse_ip(host)
    if address is not None:
        return str(address.ipv4_mapped or address) if isinstance(address, ipaddress.IPv6Address) else str(address)
    host = host.rstrip(".") if host.endswith(".") and not host.endswith("..") else host
    try:
        ascii_host = host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError(f"not a valid host name: {raw!r}") from None
    if len(ascii_host) > 253 or not all(_LABEL.match(label) for label in ascii_host.split(".")):
        raise ValueError(f"not a valid host name: {raw!r}")
    return ascii_host


def canonical_or_raw(host: str) -> str:
    """The canonical form of ``host``, or ``host`` itself when it has none (a name the policy will refuse)."""
    try:
        return normalize_host(host)
    except ValueError:
        return host


def parse_authority(value: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` (IPv6 in brackets) to its canonical host and port; raises ValueError."""
    text = value.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"unclosed bracket in {value!r}")
        host, rest = text[: close + 1], text[close + 1 :]
        port_text = rest.removeprefix(":") if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"junk after the address in {value!r}")
    else:
        host, _, port_text = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    if port_text and (not port_text.isdigit() or not 0 < int(port_text) < 65536):
        raise ValueError(f"bad port in {value!r}")
    return normalize_host(host), int(port_text) if port_text else default_port


def own_addresses() -> set[str]:
    """This container's IPv4 addresses, one per interface (the proxy refuses to be its own upstream)."""
    found: set[str] = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
            found.add(socket.inet_ntoa(packed[20:24]))
    return found
