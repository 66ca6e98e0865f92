"""What every part of Corral agrees on about brokered secrets: their names, their placeholders, where
in a request a value may be put, and the limits. Pure and stdlib-only: the gateway validates with
it, the proxy recognises placeholders with it, the sandbox puts them in commands' environments.

A placeholder is what the sandbox holds instead of a secret's value: ``corral_secret_`` and 32 hex
digits (128 random bits, made per session by the gateway). It is recognisable (the prefix) and
unguessable; it survives every encoding a request can put it through unchanged (URL, form, JSON,
multipart, headers), since it is made of letters, digits and ``_`` only.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Final, Literal, get_args

PLACEHOLDER_PREFIX: Final = "corral_secret_"
PLACEHOLDER = re.compile(r"corral_secret_[0-9a-f]{32}")
PLACEHOLDER_BYTES = re.compile(rb"corral_secret_[0-9a-f]{32}")
# Environment-variable names: the sandbox hands each placeholder to commands under its name.
NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# Names a command's environment already uses (corral.sandbox.agent.agentenv) or that change how programs
# load and run: a secret may not shadow them.
RESERVED_NAMES: Final = frozenset(
    {
        *("HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG", "DISPLAY", "TERM", "PWD", "OLDPWD", "TMPDIR"),
        *("PAGER", "GIT_PAGER", "PYTHONUNBUFFERED", "NPM_CONFIG_PREFIX", "NPM_CONFIG_UPDATE_NOTIFIER"),
        *("PIP_DISABLE_PIP_VERSION_CHECK", "GIT_HTTP_PROXY_AUTHMETHOD", "NO_PROXY"),
        *("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"),
        *("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"),
        *("IFS", "ENV", "BASH_ENV", "PROMPT_COMMAND", "PS1", "PS4", "SHELLOPTS", "BASHOPTS", "PYTHONPATH"),
        *("PYTHONSTARTUP", "PYTHONHOME", "NODE_OPTIONS", "PERL5LIB", "PERL5OPT", "RUBYOPT", "JAVA_TOOL_OPTIONS"),
    }
)
RESERVED_PREFIXES: Final = ("CORRAL_", "LD_", "BASH_FUNC_", "XDG_", "DBUS_", "GCONV_", "MALLOC_")

Location = Literal["header", "query", "body", "basic"]
LOCATIONS: Final[tuple[Location, ...]] = get_args(Location)
DEFAULT_LOCATIONS: Final[tuple[Location, ...]] = ("header",)

MAX_SECRETS: Final = 32  # per session
MAX_BINDINGS: Final = 16  # allow entries per secret
MIN_VALUE_CHARS: Final = 8  # a shorter value, scrubbed from every answer, would mangle them
MAX_VALUE_BYTES: Final = 4096  # UTF-8
# A value goes into headers: no character that ends or splits one.
FORBIDDEN_VALUE_CHARS: Final = frozenset("\x00\r\n")


def value_digest(key: str, value: bytes) -> str:
    """A secret's value as the proxy's ``status`` shows it: HMAC-SHA256 keyed with the gateway's
    control token (hex). The gateway, which holds the token, tells which value the proxy holds; a
    bare hash would let whoever reads a status guess a short value offline."""
    return hmac.new(key.encode(), value, hashlib.sha256).hexdigest()


def new_placeholder() -> str:
    return PLACEHOLDER_PREFIX + secrets.token_hex(16)


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a secret, or None when it can."""
    if NAME.fullmatch(name) is None:
        return "a secret's name is 1 to 64 characters from A-Z 0-9 _, starting with a letter"
    if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES):
        return f"{name} is reserved: commands' environments use it"
    return None


def value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a secret's value, or None when it can (never quotes the value)."""
    size = len(value.encode())
    if len(value) < MIN_VALUE_CHARS:
        return f"a secret's value is at least {MIN_VALUE_CHARS} characters"
    if size > MAX_VALUE_BYTES:
        return f"a secret's value is at most {MAX_VALUE_BYTES} bytes (UTF-8); this one has {size}"
    if not FORBIDDEN_VALUE_CHARS.isdisjoint(value):
        return "a secret's value may not hold NUL, CR or LF (it may be sent in a header)"
    if PLACEHOLDER.search(value):
        return "a secret's value may not hold a placeholder"
    return None
