"""The gateway's env file for ``corral up`` (``corral.env``): read, checked against
:class:`~corral.gateway.settings.GatewaySettings` before anything starts, and turned into what
``docker compose`` needs to hand every setting to the gateway's container.

The values travel in compose's own environment; the override file this writes names the settings
(compose takes a bare name's value from its environment) and the read-only mounts of file settings,
so no value, the API key included, is written anywhere (docs/design/0297-settings-through-compose.md).
Everything but :func:`compose_files` and :func:`read_into`'s file reads is pure."""

from __future__ import annotations

import difflib
import json
import tempfile
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, TypedDict

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from corral.envlines import DEFAULT_NAME, EnvLine, parse
from corral.errors import SettingProblem, SettingsFileInvalid
from corral.gateway import keystrength
from corral.gateway.settings import ENV_PREFIX, GatewaySettings, env_name

# Where file settings appear inside the gateway's container (one file per setting, read-only).
SETTINGS_DIR = PurePosixPath("/run/corral/settings")
# Path settings that are not files to mount: compose.yaml mounts the data dir at its own path (the
# gateway bind-mounts parts of it into the proxies, so the host's path must hold inside too).
SAME_PATH = frozenset({"data_dir"})
# Image tags `corral up` builds from its own environment (corral.images reads them at import).
BUILT_TAGS = frozenset({"CORRAL_IMAGE", "CORRAL_EGRESS_IMAGE"})
# Group and others: the file may hold CORRAL_API_KEY.
_PRIVATE_MASK = 0o077


@dataclass(frozen=True)
class FileMount:
    """A file setting: the host's file, mounted read-only where the gateway is told to read it."""

    name: str
    source: Path
    target: PurePosixPath


@dataclass(frozen=True)
class GatewayEnv:
    """An env file that passed every check: what the gateway gets from it."""

    path: Path
    # Setting name → the value compose hands on (the environment's when it sets the name too).
    values: Mapping[str, str]
    mounts: tuple[FileMount, ...]
    # Names the environment sets too: its values win, as with compose's own interpolation.
    shadowed: tuple[str, ...]
    warnings: tuple[str, ...]


class _Bind(TypedDict):
    type: str
    source: str
    target: str
    read_only: bool


class _GatewayService(TypedDict):
    environment: list[str]
    volumes: list[_Bind]


class ComposeOverride(TypedDict):
    """The compose file laid over compose.yaml: the gateway's settings by name, its file mounts."""

    services: dict[str, _GatewayService]


def settings_by_name() -> dict[str, str]:
    """Every setting's variable name → its field in :class:`GatewaySettings`."""
    return {env_name(field): field for field in GatewaySettings.model_fields}


def file_settings() -> frozenset[str]:
    """The fields whose value is a file on the host (a ``Path`` type), to mount into the container."""
    return frozenset(
        field
        for field, info in GatewaySettings.model_fields.items()
        if "Path" in str(info.annotation) and field not in SAME_PATH
    )


def check(lines: list[EnvLine], path: Path, environ: Mapping[str, str]) -> tuple[GatewayEnv, list[SettingProblem]]:
    """The settings of ``lines`` as the gateway would take them (``environ`` winning), and every
    problem: a name that is no setting or comes twice, a value the model refuses, a file not there."""
    known = settings_by_name()
    problems: list[SettingProblem] = []
    values: dict[str, str] = {}
    mounts: list[FileMount] = []
    for line in lines:
        field = known.get(line.name)
        if field is None:
            problems.append(SettingProblem(line.number, line.name, _unknown(line.name, known)))
            continue
        if line.name in values:
            problems.append(SettingProblem(line.number, line.name, "set twice (one line of it is enough)"))
            continue
        from_environ = line.name in environ
        value = environ[line.name] if from_environ else line.value
        values[line.name] = value
        trouble, mount = _setting(field, value, Path.cwd() if from_environ else path.parent)
        mounts.extend([mount] if mount is not None else [])
        if trouble is not None:
            origin = " (the value from your environment, which wins over the file)" if from_environ else ""
            problems.append(SettingProblem(line.number, line.name, trouble + origin))
    shadowed = tuple(sorted(name for name in values if name in environ))
    env = GatewayEnv(path, values, tuple(mounts), shadowed, tuple(_warnings(values, environ)))
    return env, problems


def _setting(field: str, value: str, base: Path) -> tuple[str | None, FileMount | None]:
    """One setting's value checked: what is wrong with it (or None), and its mount if it is a file
    setting (a relative path taken from ``base``: the env file's directory, or the shell's)."""
    trouble = _refusal(field, value)
    if trouble is None and field in file_settings():
        return _mount(field, value, base)
    if trouble is None and field in SAME_PATH and not Path(value).is_absolute():
        trouble = "must be an absolute path (it is mounted at the same path inside the gateway's container)"
    return trouble, None


def _unknown(name: str, known: Mapping[str, str]) -> str:
    """Why ``name`` is refused, with the nearest setting names (it is most likely a typo)."""
    if not name.startswith(ENV_PREFIX):
        what = f"not a setting of the gateway (they all start with {ENV_PREFIX})"
    else:
        what = "no setting of the gateway"
    near = difflib.get_close_matches(name.upper(), list(known), n=2, cutoff=0.6)
    return what + (f"; did you mean {' or '.join(near)}?" if near else " (docs/gateway.md lists them)")


def _refusal(field: str, value: str) -> str | None:
    """What the settings model says against ``value`` for ``field`` (its rule, never the value), or None."""
    info = GatewaySettings.model_fields[field]
    try:
        _adapter(info).validate_python(value)
    except ValidationError as exc:
        return "; ".join(error["msg"] for error in exc.errors(include_input=False))
    if field == "api_key":
        trouble = keystrength.problem([key.strip() for key in value.split(",") if key.strip()])
        # The problem names the setting itself; the problem's own name says it already.
        return None if trouble is None else trouble.removeprefix(f"{env_name(field)}: ")
    return None


def _adapter(info: FieldInfo) -> TypeAdapter[object]:
    """A validator of one field alone (its type and its constraints), as the gateway reads it from the environment."""
    # A field's annotation is a runtime type form (str, int | None, Literal[...]): TypeAdapter takes any.
    form: Any = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return TypeAdapter(form)


def _mount(field: str, value: str, base: Path) -> tuple[str | None, FileMount | None]:
    """A file setting's mount (a relative path taken from ``base``), or why there is none."""
    if not value:
        return "empty: leave the line out to leave the setting unset", None
    source = (base / value).resolve()
    if not source.is_file():
        return f"no such file: {source}", None
    return None, FileMount(env_name(field), source, SETTINGS_DIR / field)


def _warnings(values: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
    """Image tags set in the file but not in the shell: the build makes the shell's."""
    return [
        f"{name} comes from the env file: `corral up` builds the tag of its own environment's {name};"
        f" set it there too (or build with `corral images build`) so the gateway does not run a stale image"
        for name in sorted(BUILT_TAGS & values.keys())
        if name not in environ
    ]


def mode_warning(path: Path, mode: int) -> str | None:
    """A warning when others than the owner may read or change the file (it may hold the API key)."""
    if mode & _PRIVATE_MASK == 0:
        return None
    return f"{path} is mode {mode & 0o777:04o}: others may read it and it may hold CORRAL_API_KEY; chmod 600 {path}"


def load(path: Path, environ: Mapping[str, str]) -> GatewayEnv:
    """Read and check the env file at ``path``; :class:`SettingsFileInvalid` with every problem found."""
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsFileInvalid(str(path), [SettingProblem(None, None, f"cannot be read: {_reason(exc)}")]) from None
    lines, problems = parse(text)
    env, more = check(lines, path, environ)
    problems = sorted([*problems, *more], key=lambda problem: problem.line or 0)
    if problems:
        raise SettingsFileInvalid(str(path), problems)
    warning = mode_warning(path, mode)
    return env if warning is None else replace(env, warnings=(warning, *env.warnings))


def _reason(exc: OSError | UnicodeDecodeError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return exc.strerror or type(exc).__name__


def locate(option: Path | None, root: Path) -> Path | None:
    """The env file to read: the one named (it must be there), else ``corral.env`` at ``root`` if any."""
    if option is not None:
        if not option.is_file():
            raise SettingsFileInvalid(str(option), [SettingProblem(None, None, "no such file")])
        return option
    default = root / DEFAULT_NAME
    return default if default.is_file() else None


def read_into(option: Path | None, root: Path, environ: MutableMapping[str, str]) -> GatewayEnv | None:
    """The env file's settings (see :func:`locate`), checked, then put in ``environ`` where it has
    none of its own: compose, and the CLI's own port and instance, read them there."""
    path = locate(option, root)
    if path is None:
        return None
    env = load(path, environ)
    for name, value in env.values.items():
        environ.setdefault(name, value)
    return env


def override(env: GatewayEnv) -> ComposeOverride:
    """The compose file laid over compose.yaml: each setting by name only (its value comes from
    compose's environment, never from a file), file settings pointed at their read-only mounts."""
    targets = {mount.name: mount.target for mount in env.mounts}
    environment = [f"{name}={targets[name]}" if name in targets else name for name in sorted(env.values)]
    volumes: list[_Bind] = [
        # `$$`: compose would read a `$` in a host path as a variable.
        {"type": "bind", "source": str(mount.source).replace("$", "$$"), "target": str(mount.target), "read_only": True}
        for mount in env.mounts
    ]
    return {"services": {"gateway": {"environment": environment, "volumes": volumes}}}


def compose_file_args(root: Path, override_path: Path) -> list[str]:
    """``docker compose``'s ``-f`` arguments: the files compose would find itself, then the override."""
    found = [root / name for name in ("compose.yaml", "compose.override.yaml") if (root / name).is_file()]
    return [arg for path in [*found, override_path] for arg in ("-f", str(path))]


@contextmanager
def compose_files(root: Path, env: GatewayEnv | None) -> Iterator[list[str]]:
    """The ``-f`` arguments for one compose command, the override written for its length into a
    private temporary directory (it holds names and host paths, no value); none without an env file."""
    if env is None:
        yield []
        return
    with tempfile.TemporaryDirectory(prefix="corral-compose-") as folder:
        path = Path(folder) / "settings.override.json"  # JSON is YAML: compose reads it as it is
        path.write_text(json.dumps(override(env), indent=2))
        yield compose_file_args(root, path)
