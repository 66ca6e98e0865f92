"""``corral.env``'s lines (``NAME=VALUE``), read with the standard library only: the gateway's
settings check (corral.gateway.envfile) and the client commands, which take the gateway's address
and key from the same file (a client install has no pydantic-settings)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from corral.errors import SettingProblem

DEFAULT_NAME = "corral.env"
# What a client command reads of the file: where the gateway listens and the key it takes.
CLIENT_NAMES = ("CORRAL_PORT", "CORRAL_API_KEY")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class EnvLine:
    """One ``NAME=VALUE`` line of the file, its value unquoted."""

    number: int
    name: str
    value: str


def parse(text: str) -> tuple[list[EnvLine], list[SettingProblem]]:
    """The file's ``NAME=VALUE`` lines and the lines that are not (named by number, never quoted:
    a broken line may hold a secret). Blank lines and ``#`` comments are skipped."""
    lines: list[EnvLine] = []
    problems: list[SettingProblem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, equals, rest = stripped.partition("=")
        name = name.strip()
        value = _unquoted(rest.strip())
        if not equals or not _NAME.fullmatch(name):
            problems.append(SettingProblem(number, None, "not NAME=VALUE (a name, `=`, then the value)"))
        elif value is None:
            problems.append(SettingProblem(number, name, "a quote is not closed, or text follows the closing one"))
        else:
            lines.append(EnvLine(number, name, value))
    return lines, problems


def _unquoted(raw: str) -> str | None:
    """A value as written: in matching quotes, what lies between them (taken as it is); else up to
    a ``#`` that follows a space. None when a quote is left open or text follows the closing one."""
    if raw[:1] in ("'", '"'):
        quote = raw[0]
        end = raw.find(quote, 1)
        after = raw[end + 1 :].strip() if end > 0 else ""
        if end < 0 or (after and not after.startswith("#")):
            return None
        return raw[1:end]
    comment = re.search(r"\s#", raw)
    return raw[: comment.start()].rstrip() if comment else raw


def client_settings(path: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The client's names the file sets and the environment does not (the shell wins, as it does
    for `corral up`); nothing when the file cannot be read or a line is broken (`corral up` names
    those problems: a client command only looks)."""
    try:
        lines, problems = parse(path.read_text())
    except (OSError, UnicodeDecodeError):
        return {}
    if problems:
        return {}
    return {line.name: line.value for line in lines if line.name in CLIENT_NAMES and line.name not in environ}


def checkout_root() -> Path | None:
    """The source checkout this package runs from (the folder holding images/), or None for an
    install from a wheel. Standard library only: corral.images, which also needs it, imports Docker."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "images" / "desktop" / "Dockerfile").is_file():
            return parent
    return None


def take_client_settings(root: Path | None, environ: MutableMapping[str, str] = os.environ) -> None:
    """``corral.env`` at the checkout's ``root`` (if any) puts the client's names in ``environ``."""
    if root is not None and (root / DEFAULT_NAME).is_file():
        environ.update(client_settings(root / DEFAULT_NAME, environ))
