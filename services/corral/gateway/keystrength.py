"""Whether an API key given to the gateway (``CORRAL_API_KEY``) is too short or too guessable to hold.

Pure, no I/O: ``corral up`` checks the key before it starts the gateway, and the gateway checks it
again when it reads its settings (:meth:`GatewaySettings.api_keys`), with the same message. A key is
refused when it is shorter than :data:`MIN_LENGTH`, when it uses one kind of character only (only
lower-case letters, only digits...), when it is a shorter part repeated, or when it holds under
:data:`MIN_BITS` bits by :func:`estimated_bits` (``aaaa...ab1`` is long and has three kinds, and
still holds a few bits; ``Password123Password123...`` holds the bits of its first eleven). The key the
gateway generates (``crl_`` and 32 random bytes, base64url) holds about 240 bits by this estimate.
"""

from __future__ import annotations

import math
import string
from collections import Counter

MIN_LENGTH = 32
MIN_BITS = 96
REPEAT = 4
ADVICE = (
    "use a random key of at least 32 characters, e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
    " or `openssl rand -hex 32`, or leave CORRAL_API_KEY unset and the gateway makes one (`corral status` shows it)"
)
_KINDS = (string.ascii_lowercase, string.ascii_uppercase, string.digits)


def _novel(key: str) -> int:
    """Characters of the key that do not repeat an earlier part of it (a run of :data:`REPEAT` or
    more that occurred before counts as nothing new: ``Password123Password123`` holds 11)."""
    novel, at = 0, 0
    while at < len(key):
        if at + REPEAT <= len(key) and key[at : at + REPEAT] in key[: at + REPEAT - 1]:
            at += REPEAT
        else:
            novel, at = novel + 1, at + 1
    return novel


def estimated_bits(key: str) -> float:
    """The Shannon entropy of the key's characters' frequencies, times its characters that repeat
    nothing before them, in bits: a rough guess, but one that random keys pass by far and keys made
    of a word, a pattern or a repeat do not."""
    if not key:
        return 0.0
    counts = Counter(key)
    per_char = -sum(n / len(key) * math.log2(n / len(key)) for n in counts.values())
    return per_char * _novel(key)


def _kinds(key: str) -> int:
    """How many kinds of character the key uses: lower case, upper case, digits, anything else."""
    used = {next((i for i, kind in enumerate(_KINDS) if char in kind), len(_KINDS)) for char in key}
    return len(used)


def _repeated(key: str) -> bool:
    """Whether the key is a shorter part written again and again (``abc123abc123...``)."""
    return any(
        len(key) % period == 0 and key == key[:period] * (len(key) // period) for period in range(1, len(key) // 2 + 1)
    )


def weakness(key: str) -> str | None:
    """Why ``key`` is too weak to hold (never quoting it), or None when it is not."""
    if len(key) < MIN_LENGTH:
        return f"is {len(key)} characters long, under {MIN_LENGTH}"
    if _kinds(key) < 2:
        return "uses one kind of character only"
    if _repeated(key):
        return "is a shorter part repeated"
    bits = estimated_bits(key)
    if bits < MIN_BITS:
        return f"holds about {bits:.0f} bits by its characters, under {MIN_BITS}"
    return None


def problem(keys: list[str]) -> str | None:
    """What to tell the operator about the first weak key among ``keys`` (by its place), or None."""
    for place, key in enumerate(keys, start=1):
        why = weakness(key)
        if why is not None:
            which = "the API key" if len(keys) == 1 else f"API key {place} of {len(keys)}"
            return f"CORRAL_API_KEY: {which} {why}: too guessable to hold; {ADVICE}"
    return None
