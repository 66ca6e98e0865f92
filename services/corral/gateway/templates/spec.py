"""A template's file, read: ``corral.template.yaml`` (YAML, ``safe_load`` into a frozen model, every
list and string bounded) or a Dockerfile whose first line is ``FROM corral-desktop:latest``; names
and references (``NAME``, ``NAME:VERSION``). Pure: what is wrong raises :class:`TemplateInvalid`
(the field or the line to blame) or :class:`TemplateRefused` (what would weaken the sandbox)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from corral.errors import TemplateInvalid, TemplateRefused

TEMPLATE_FILE = "corral.template.yaml"
MAX_FILE_BYTES = 64 << 10
# A Docker repository component (lowercase, separators between alphanumerics): the name is the image's.
NAME = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
MAX_NAME = 48
BASE_REFERENCE = "corral-desktop:latest"  # what a Dockerfile template names as its base

# Paths the base owns: the controller and its virtualenv, boot's users and trust, the agent's login
# profile, Chromium's policy, openbox's configuration (corral.gateway.templates.check holds them at build).
PROTECTED = (
    "/opt/corral",
    "/usr/share/corral",
    "/etc/passwd",
    "/etc/group",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/profile",
    "/etc/profile.d/corral.sh",
    "/etc/chromium/policies",
    "/etc/xdg/openbox",
    "/usr/bin/tini",
)
# Where nothing is copied: the kernel's and the runtime's, or mounted over at run time.
UNWRITABLE = ("/proc", "/sys", "/dev", "/run", "/tmp", "/etc/ssl/certs")
# Dockerfile instructions that would change how the sandbox starts or who it runs as.
REFUSED_INSTRUCTIONS = {"ENTRYPOINT", "CMD", "USER", "HEALTHCHECK", "VOLUME", "STOPSIGNAL", "ONBUILD", "SHELL"}


def under(path: str, roots: tuple[str, ...]) -> str | None:
    """The root of ``roots`` that ``path`` is (or is under), if any."""
    return next((root for root in roots if path == root or path.startswith(root.rstrip("/") + "/")), None)


def _pattern(regex: str, what: str) -> AfterValidator:
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


def _dest(value: str) -> str:
    parts = value.split("/")
    if not value.startswith("/") or ".." in parts or "\0" in value:
        raise ValueError("dest is an absolute path without '..'")
    root = under(value, PROTECTED) or under(value, UNWRITABLE)
    if root is not None:
        raise ValueError(f"{value} is under {root}, which the base owns or the runtime mounts over")
    return value.rstrip("/") or "/"


def _src(value: str) -> str:
    parts = value.split("/")
    if value.startswith("/") or ".." in parts or "\0" in value or not value.strip("/."):
        raise ValueError("src is a path relative to the build context, without '..'")
    return "/".join(part for part in parts if part not in ("", "."))


def _mode(value: int | str) -> int:
    mode = int(value, 8) if isinstance(value, str) else value
    if not 0 <= mode <= 0o7777:
        raise ValueError("mode is an octal permission, e.g. '0644'")
    if mode & 0o6000:
        raise ValueError("setuid and setgid bits are refused: a template cannot add privileged programs")
    return mode


AptPackage = Annotated[
    str, Field(max_length=128), _pattern(r"[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+:~-]+)?", "a Debian package")
]
PipRequirement = Annotated[
    str,
    Field(max_length=200),
    _pattern(
        r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?((==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!-]+(,(==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!-]+)*)?",
        "a Python requirement (name, extras, version)",
    ),
]
NpmPackage = Annotated[
    str,
    Field(max_length=214),
    _pattern(r"(@[a-z0-9~][a-z0-9._~-]*/)?[a-z0-9~][a-z0-9._~-]*(@[A-Za-z0-9.^~<>=*+ |-]+)?", "an npm package"),
]
EnvName = Annotated[str, Field(max_length=128), _pattern(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name")]
# Set by the session for each command (its proxy with the action's id, its CA bundle): a template's would be lost.
RESERVED_ENV = frozenset(
    {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"}
    | {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"}
)


def _env(value: dict[str, str]) -> dict[str, str]:
    for name, text in value.items():
        if name in RESERVED_ENV or name.startswith("CORRAL_"):
            raise ValueError(f"{name} is the session's own (its proxy, its CA bundle, Corral's settings)")
        if "\0" in text:
            raise ValueError(f"{name}'s value holds a NUL byte")
    return value


class TemplateFile(BaseModel):
    """A file (or a directory, copied whole) of the build context put into the image."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    src: Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(_src)]
    dest: Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(_dest)]
    mode: Annotated[int | str, AfterValidator(_mode)] | None = None


class TemplateSpec(BaseModel):
    """``corral.template.yaml``: what a template adds to the base image."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    apt: Annotated[list[AptPackage], Field(max_length=64)] = Field(default_factory=list)
    pip: Annotated[list[PipRequirement], Field(max_length=64)] = Field(default_factory=list)
    npm: Annotated[list[NpmPackage], Field(max_length=64)] = Field(default_factory=list)
    files: Annotated[list[TemplateFile], Field(max_length=256)] = Field(default_factory=list)
    env: Annotated[
        dict[EnvName, Annotated[str, Field(max_length=4096)]], Field(max_length=64), AfterValidator(_env)
    ] = Field(default_factory=dict)
    # Run at build, as root, after the packages and files: an argument list, or a string run by bash.
    setup: (
        Annotated[list[Annotated[str, Field(max_length=4096)]], Field(min_length=1, max_length=256)]
        | (Annotated[str, Field(min_length=1, max_length=16384)])
        | None
    ) = None

    def setup_argv(self) -> list[str] | None:
        if self.setup is None:
            return None
        return ["bash", "-euo", "pipefail", "-c", self.setup] if isinstance(self.setup, str) else list(self.setup)


@dataclass(frozen=True, slots=True)
class DockerfileTemplate:
    """A Dockerfile template: its lines after the ``FROM`` of the base (which the build pins to the
    base's id) and the environment its ``ENV`` lines set (for commands too, as a YAML template's)."""

    body: str


def parse_yaml(text: bytes) -> TemplateSpec:
    if len(text) > MAX_FILE_BYTES:
        raise TemplateInvalid(f"{TEMPLATE_FILE} is over {MAX_FILE_BYTES} bytes", field="file")
    try:
        data = yaml.safe_load(text.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise TemplateInvalid(f"{TEMPLATE_FILE} is not YAML: {exc}", field="file") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TemplateInvalid(f"{TEMPLATE_FILE} holds a mapping (apt, pip, npm, files, env, setup)", field="file")
    try:
        return TemplateSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        message = str(first.get("msg", "invalid"))
        if "setuid" in message:
            raise TemplateRefused(f"{where}: {message}", field=where) from None
        raise TemplateInvalid(f"{where or TEMPLATE_FILE}: {message}", field=where or "file") from None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """A Dockerfile's instructions with their continuation lines joined, numbered by their first line."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        out.append((start, " ".join(pending).strip()))
        pending = []
    if pending:
        out.append((start, " ".join(pending).strip()))
    return out


def parse_dockerfile(text: bytes) -> DockerfileTemplate:
    """A Dockerfile template: its first line ``FROM corral-desktop:latest``, no other ``FROM``, no
    ``# syntax=`` line (no BuildKit frontend to fetch here), none of :data:`REFUSED_INSTRUCTIONS`."""
    if len(text) > MAX_FILE_BYTES:
        raise TemplateInvalid(f"the Dockerfile is over {MAX_FILE_BYTES} bytes", field="file")
    try:
        source = text.decode("utf-8")
    except UnicodeDecodeError:
        raise TemplateInvalid("the Dockerfile is not UTF-8", field="file") from None
    first = source.splitlines()[0].strip() if source.strip() else ""
    if first.split() != ["FROM", BASE_REFERENCE]:
        raise TemplateInvalid(f"a Dockerfile template's first line is `FROM {BASE_REFERENCE}`", field="file")
    lines = _logical_lines(source)
    for number, line in lines[1:]:
        word = line.split(maxsplit=1)[0].upper()
        if word == "FROM":
            raise TemplateInvalid(f"line {number}: one FROM only, the base's (no other image to build from)", "file")
        if word in REFUSED_INSTRUCTIONS:
            raise TemplateRefused(
                f"line {number}: {word} would change how the sandbox starts or who it runs as; "
                "the boot, its users and its entrypoint are the base's",
                field="file",
            )
    body = "\n".join(source.splitlines()[1:])
    return DockerfileTemplate(body)


def parse_template(name: str, text: bytes) -> TemplateSpec | DockerfileTemplate:
    """The template file ``name`` of the context: a Dockerfile by its first line, YAML otherwise."""
    head = text.lstrip()[:64].upper()
    if head.startswith(b"FROM ") or name.rsplit("/", 1)[-1].lower().startswith("dockerfile"):
        return parse_dockerfile(text)
    return parse_yaml(text)


@dataclass(frozen=True, slots=True)
class TemplateRef:
    """``NAME`` (its newest version) or ``NAME:VERSION``."""

    name: str
    version: int | None = None

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name}:{self.version}"


def check_name(name: str, field: str = "name") -> str:
    if len(name) > MAX_NAME or not NAME.fullmatch(name):
        raise TemplateInvalid(
            f"a template's name is up to {MAX_NAME} lowercase letters, digits and single . _ - between them",
            field=field,
        )
    return name


def parse_ref(text: str, field: str = "template") -> TemplateRef:
    name, sep, version = text.partition(":")
    check_name(name, field)
    if not sep:
        return TemplateRef(name)
    if not version.isdigit() or len(version) > 9 or int(version) < 1:
        raise TemplateInvalid(f"{text!r}: a version is a whole number from 1", field=field)
    return TemplateRef(name, int(version))
