"""Who may drive the controller: whoever holds its per-boot secret, and no browser.

The sandbox's boot writes a fresh secret into a file only the controller's uid can read; the gateway
reads it through the runtime (never an environment variable, never the sandbox's own network). The
secret itself never travels:

- a request carries ``x-corral-auth: v1.<unix seconds>.<nonce>.<HMAC(secret, request|ts|nonce)>``;
  the controller refuses stale stamps and nonces it has seen, so a captured header cannot be replayed;
- the controller answers with ``x-corral-proof: HMAC(secret, reply|nonce)``, so a caller can tell the
  real controller from anything else that got hold of its port (a process of the agent's uid after a
  crash) before it believes a single byte of the reply.

Pure: no I/O but reading the secret file.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

AUTH_HEADER = "x-corral-auth"
PROOF_HEADER = "x-corral-proof"
SECRET_DIR = Path("/run/corral/controller")  # 0700, the controller's uid
SECRET_FILE = SECRET_DIR / "secret"  # 0400
# Boot's log line once the secret is in place: the runtime reads the file when it shows, not before
# (each early read is a failed ``docker exec``, about 60 ms of the host's CPU while the sandbox boots).
SECRET_WRITTEN = "controller secret written"
PROXY_TOKEN_FILE = Path("/run/corral-secrets/proxy-token")  # the control channel's, mounted by the runtime
_VERSION = "v1"
MAX_SKEW_S = 120  # a stamp older or newer than this is refused; nonces are remembered as long
_MAX_NONCES = 100_000


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def read_secret(path: Path = SECRET_FILE) -> str:
    """The secret in ``path``; raises OSError or ValueError (an empty or malformed file)."""
    value = path.read_text(encoding="ascii").strip()
    if len(value) < 32 or not value.isascii() or not value.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"{path} does not hold a controller secret")
    return value


def _mac(secret: str, *parts: str) -> str:
    return hmac.new(secret.encode(), "|".join(parts).encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """The headers for one request and the nonce its reply must prove."""

    headers: dict[str, str]
    nonce: str


def sign(secret: str, now: float | None = None) -> SignedRequest:
    stamp = str(int(time.time() if now is None else now))
    nonce = secrets.token_urlsafe(16)
    return SignedRequest({AUTH_HEADER: f"{_VERSION}.{stamp}.{nonce}.{_mac(secret, 'request', stamp, nonce)}"}, nonce)


def prove(secret: str, nonce: str) -> str:
    return _mac(secret, "reply", nonce)


def proven(secret: str, nonce: str, headers: Mapping[str, str]) -> bool:
    """True when ``headers`` (a reply's) carry the controller's proof for ``nonce``."""
    proof = headers.get(PROOF_HEADER, "")
    return hmac.compare_digest(proof.encode(), prove(secret, nonce).encode())


@dataclass
class RequestVerifier:
    """The controller's side: checks ``x-corral-auth`` values, each nonce once within the skew window."""

    secret: str
    _seen: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def verify(self, value: str, now: float | None = None) -> str:
        """The request's nonce; raises ValueError with the reason when the value is not good."""
        now = time.time() if now is None else now
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[1].isdigit():
            raise ValueError(f"{AUTH_HEADER} is malformed")
        _, stamp, nonce, mac = parts
        if not hmac.compare_digest(mac.encode(), _mac(self.secret, "request", stamp, nonce).encode()):
            raise ValueError(f"{AUTH_HEADER} does not match this controller's secret")
        if abs(now - int(stamp)) > MAX_SKEW_S:
            raise ValueError(f"{AUTH_HEADER} is stale")
        self._forget(now)
        if nonce in self._seen:
            raise ValueError(f"{AUTH_HEADER} was used before")
        self._seen[nonce] = now
        return nonce

    def _forget(self, now: float) -> None:
        # Insertion order is time order: drop from the front what no valid stamp can reuse.
        while self._seen and (len(self._seen) >= _MAX_NONCES or next(iter(self._seen.values())) < now - 2 * MAX_SKEW_S):
            self._seen.popitem(last=False)
