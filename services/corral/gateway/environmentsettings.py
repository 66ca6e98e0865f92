"""The settings of what may outlive a session (docs/environments.md): templates' warm pools and build
contexts, workspace volumes, saved browser profiles and their key, paused sessions. A base of
:class:`~corral.gateway.settings.GatewaySettings`, which reads them all from ``CORRAL_*`` alike;
apart only so that neither class holds everything."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

from corral.errors import InvalidRequest

MIN_PROFILE_KEY_CHARS = 32


def profile_key_problem(value: str) -> str | None:
    """Why ``value`` will not do as the profile key (corral.gateway.profiles); None when it will. Pure."""
    if len(value) < MIN_PROFILE_KEY_CHARS:
        return f"must be at least {MIN_PROFILE_KEY_CHARS} characters (e.g. `openssl rand -hex 32`)"
    if len(set(value)) < 8:
        return "is too repetitive to be a key (e.g. `openssl rand -hex 32`)"
    return None


class EnvironmentSettings(BaseSettings):
    pool: dict[str, int] = Field(
        default={},
        description=(
            "Warm pools of templates, beside `CORRAL_POOL_SIZE`'s of the base: a JSON object of template names to "
            'sizes, e.g. `{"py": 2}`; each pool holds its template\'s newest version '
            "([environments.md](environments.md))."
        ),
    )
    template_context_max_mb: int = Field(
        default=64, ge=1, le=1024, description="A template's build context (`POST /v1/templates`), at most."
    )
    max_paused: int = Field(
        default=16,
        ge=0,
        description="Paused sessions kept at once, all keys together (past it a pause is refused: 429).",
    )
    max_paused_per_key: int = Field(default=8, ge=0, description="Paused sessions kept at once per API key (429).")
    paused_ttl_s: int = Field(
        default=86400, ge=1, description="A session paused this long ends, its saved state removed."
    )
    pause_archive_max_mb: int = Field(
        default=1024,
        ge=1,
        description="The most a pause saves of each of `/workspace` and `/home/agent` (past it the pause is refused).",
    )
    volume_default_mb: int = Field(
        default=1024, ge=16, description="A workspace volume's size (its quota) when `POST /v1/volumes` asks for none."
    )
    volume_max_mb: int = Field(
        default=10240,
        ge=16,
        description="The largest workspace volume a key may make (its space is reserved on the host when made).",
    )
    max_volumes_per_key: int = Field(
        default=16, ge=0, description="Workspace volumes per API key (past it: 429 `too_many_volumes`)."
    )
    profile_key: str = Field(
        default="",
        description=(
            "The secret (32 or more characters, e.g. `openssl rand -hex 32`) saved browser profiles are encrypted "
            "under ([environments.md](environments.md#browser-profiles)); unset with no `CORRAL_PROFILE_KEY_FILE`: "
            "no saved profiles. A secret in the environment: prefer the file form."
        ),
    )
    profile_key_file: Path | None = Field(
        default=None,
        description=(
            "A file (0600) holding the profile key, read at start: the form to use (`corral up` mounts it "
            "read-only; nothing secret in the environment). Wins over `CORRAL_PROFILE_KEY`."
        ),
    )
    profile_max_mb: int = Field(
        default=64,
        ge=1,
        description=(
            "A saved browser profile's size (its cookies, local storage and IndexedDB archived); a save over it "
            "fails (413) and the saved version stays."
        ),
    )

    def profile_secret(self) -> str | None:
        """The profile key: the file's (its text, stripped) when one is named, else the setting's;
        None when neither is set. :class:`InvalidRequest` for a key too weak to hold (or a file that
        cannot be read), which stops the gateway at start."""
        value = self.profile_key
        if self.profile_key_file is not None:
            try:
                value = self.profile_key_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise InvalidRequest(f"cannot read it: {exc}", field="CORRAL_PROFILE_KEY_FILE") from None
        if not value:
            return None
        trouble = profile_key_problem(value)
        if trouble is not None:
            raise InvalidRequest(trouble, field="CORRAL_PROFILE_KEY")
        return value
