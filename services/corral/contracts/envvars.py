"""What the gateway and the sandbox agree on about a session's environment variables (``env`` at create):
which names may be set, how many and how big. Pure and stdlib-only: the gateway checks a create with
it, the controller checks what the gateway puts (``PUT /v1/env``) with it again, since it must not
trust a malformed body.

A session's env is placed in every command the agent runs (exec, the persistent shell, the vendors'
bash tools, PTY commands). It is the agent's to read: never a secret's value (secrets stay brokered,
docs/secrets.md). It may not shadow what Corral itself sets in a command's environment (``PATH``,
``HOME``, the proxy and CA bundle variables, ``CORRAL_*``: the same reserved names a secret may not
take, in any case, so ``http_proxy`` is refused with ``HTTP_PROXY``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Final

from corral.contracts.placeholders import RESERVED_NAMES, RESERVED_PREFIXES

# A POSIX shell's name (bash exports nothing else), bounded.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_VARS: Final = 64
MAX_NAME_CHARS: Final = 128
MAX_VALUE_BYTES: Final = 8192  # UTF-8
# NAME=VALUE of all of them together: every exec's launcher message carries them (at most 160 KiB,
# 96 KiB of which an exec's own argv, env and cwd may take).
MAX_TOTAL_BYTES: Final = 32 * 1024


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a session's environment variable, or None when it can."""
    if len(name) > MAX_NAME_CHARS or NAME.fullmatch(name) is None:
        return f"an environment variable's name is 1 to {MAX_NAME_CHARS} characters of A-Z a-z 0-9 _, not a digit first"
    upper = name.upper()
    if upper in RESERVED_NAMES or upper.startswith(RESERVED_PREFIXES):
        return f"{name} is reserved: Corral sets it in every command's environment, or it changes how programs run"
    return None


def value_problem(value: str) -> str | None:
    """Why ``value`` cannot be an environment variable's value, or None when it can (never quotes it)."""
    if "\0" in value:
        return "an environment variable's value may not hold a NUL byte"
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        return "an environment variable's value is UTF-8 text"
    if size > MAX_VALUE_BYTES:
        return f"an environment variable's value is at most {MAX_VALUE_BYTES} bytes (UTF-8); this one has {size}"
    return None


def set_problem(env: Mapping[str, str]) -> tuple[str, str] | None:
    """The first problem with a whole set, as (field under ``env``, words), or None: its count, each
    name and value, and its total size."""
    if len(env) > MAX_VARS:
        return "", f"{len(env)} environment variables; at most {MAX_VARS}"
    total = 0
    for name, value in env.items():
        problem = name_problem(name) or value_problem(value)
        if problem is not None:
            return name, problem
        total += len(name.encode()) + 1 + len(value.encode())
    if total > MAX_TOTAL_BYTES:
        return "", f"the environment variables take {total} bytes as NAME=VALUE; at most {MAX_TOTAL_BYTES}"
    return None


def digest(env: Mapping[str, str]) -> str:
    """One SHA-256 over a whole set (names sorted): what the controller answers for the set it holds,
    so the gateway's watchdog can tell a lost set without the values coming back."""
    canonical = json.dumps(sorted(env.items()), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
