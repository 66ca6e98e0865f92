"""The gateway's request and response bodies."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_core import PydanticCustomError

from corral.contracts import envvars
from corral.contracts.placeholders import (
    DEFAULT_LOCATIONS,
    MAX_BINDINGS,
    MAX_SECRETS,
    Location,
    name_problem,
    value_problem,
)
from corral.contracts.previews import port_problem
from corral.gateway.tickets import MAX_TTL_S
from corral.proxy.policy import parse_rule


def _allow_entry(value: str) -> str:
    """An allowlist entry in the egress policy's grammar, stored in its canonical text."""
    try:
        return str(parse_rule(value))
    except ValueError as exc:
        raise PydanticCustomError("allow_entry", "{message}", {"message": str(exc)}) from None


# `[METHODS ]host[:port][/path-prefix]`, e.g. "example.com", "*.example.com", "GET docs.example.com/guide/".
HostPattern = Annotated[str, Field(min_length=1, max_length=2048), AfterValidator(_allow_entry)]


EgressMode = Literal["enforce", "report"]


def _secret_name(name: str) -> str:
    problem = name_problem(name)
    if problem is not None:
        raise PydanticCustomError("secret_name", "{message}", {"message": problem})
    return name


def _secret_value(value: SecretStr) -> SecretStr:
    problem = value_problem(value.get_secret_value())  # its words never quote the value
    if problem is not None:
        raise PydanticCustomError("secret_value", "{message}", {"message": problem})
    return value


# An environment variable's name (corral.contracts.placeholders.NAME), none a command's environment uses.
SecretName = Annotated[str, AfterValidator(_secret_name)]
# Never shown: SecretStr's repr and str are stars, and the checks' messages never quote it.
SecretValue = Annotated[SecretStr, AfterValidator(_secret_value)]
# Where in a request the proxy may put a secret's value: a non-empty set, headers unless said.
Locations = Annotated[list[Location], Field(min_length=1, max_length=4)]
Bindings = Annotated[list[HostPattern], Field(min_length=1, max_length=MAX_BINDINGS)]


class SecretSpec(BaseModel):
    """A secret the session's proxy puts into requests in place of its placeholder: for these hosts
    (each also on the session's allowlist) and these places only."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    value: SecretValue
    allow: Bindings
    in_: Locations = Field(default_factory=lambda: list(DEFAULT_LOCATIONS), alias="in")


class SecretUpdate(BaseModel):
    """PATCH: a new secret (value and allow), or an existing one's new value, bindings or places
    (what is not given is kept)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    value: SecretValue | None = None
    allow: Bindings | None = None
    in_: Locations | None = Field(default=None, alias="in")

    @model_validator(mode="after")
    def _changes_something(self) -> SecretUpdate:
        if self.value is None and self.allow is None and self.in_ is None:
            raise PydanticCustomError("secret_update", "give the secret's value, allow or in (null revokes it)")
        return self


CreateSecrets = Annotated[dict[SecretName, SecretSpec], Field(max_length=MAX_SECRETS)]
# name -> a new secret or a change of one, or null: revoke it.
UpdateSecrets = Annotated[dict[SecretName, SecretUpdate | None], Field(max_length=MAX_SECRETS)]


def _env_name(name: str) -> str:
    problem = envvars.name_problem(name)
    if problem is not None:
        raise PydanticCustomError("env_name", "{message}", {"message": problem})
    return name


def _env_value(value: str) -> str:
    problem = envvars.value_problem(value)  # its words never quote the value
    if problem is not None:
        raise PydanticCustomError("env_value", "{message}", {"message": problem})
    return value


def _env_set(env: dict[str, str]) -> dict[str, str]:
    problem = envvars.set_problem(env)  # the total size: each name and value passed already
    if problem is not None:
        raise PydanticCustomError("env_size", "{message}", {"message": problem[1]})
    return env


# A session's environment variables (corral.contracts.envvars): in every command the agent runs, the
# agent's to read; never a secret's value (the create refuses one: env_secret_problem).
EnvVars = Annotated[
    dict[Annotated[str, AfterValidator(_env_name)], Annotated[str, AfterValidator(_env_value)]],
    Field(max_length=envvars.MAX_VARS),
    AfterValidator(_env_set),
]


def env_secret_problem(env: dict[str, str], secrets: dict[str, str]) -> tuple[str, str] | None:
    """(name, words) when one of ``env`` would hand the agent a brokered secret (``secrets``: name ->
    value): a variable named as a secret, or a value holding a secret's value. The words quote no value."""
    for name, value in env.items():
        if name in secrets:
            return name, f"{name} is one of the session's secrets: a secret reaches commands as its placeholder"
        if any(secret in value for secret in secrets.values()):
            return name, "a value may not hold a secret's value: secrets stay brokered, env is the agent's to read"
    return None


class Viewport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: Annotated[int, Field(ge=320, le=3840)] = 1280
    height: Annotated[int, Field(ge=240, le=2160)] = 800


IdleAction = Literal["end", "pause"]


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpus: Annotated[float, Field(gt=0, le=64)] | None = None
    memory_mb: Annotated[int, Field(ge=256, le=65536)] | None = None
    disk_mb: Annotated[int, Field(ge=64, le=65536)] | None = None


# A workspace volume's name: what a path, a CLI argument and a URL segment can all carry unquoted.
VolumeName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")]


class CreateVolume(BaseModel):
    """POST /v1/volumes: a named workspace volume for this API key; ``size_mb`` its quota
    (CORRAL_VOLUME_DEFAULT_MB when unset, at most CORRAL_VOLUME_MAX_MB)."""

    model_config = ConfigDict(extra="forbid")
    name: VolumeName
    size_mb: Annotated[int, Field(ge=16)] | None = None


class VolumeOut(BaseModel):
    """A workspace volume as the API answers it: ``used_bytes`` by statfs while a session holds it,
    else as its last holder left it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    size_mb: int
    used_bytes: int
    in_use_by: str | None  # the session holding it (live, paused or being created), or None
    created_at: float


class ProfileRef(BaseModel):
    """A saved browser profile a session loads (``save``: and saves at its end, made empty when missing)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    save: bool = False


class ProfileOut(BaseModel):
    """A saved browser profile as its owner sees it: never its contents."""

    model_config = ConfigDict(frozen=True)
    name: str
    size: int  # the archive's bytes (cookies, local storage, IndexedDB), before encryption
    saved_at: float


class DeletedProfile(BaseModel):
    name: str
    deleted: bool = True


class CreateSession(BaseModel):
    model_config = ConfigDict(extra="forbid")
    allow: Annotated[list[HostPattern], Field(max_length=256)] = Field(default_factory=list)
    viewport: Viewport = Field(default_factory=Viewport)
    timeout_s: Annotated[int, Field(ge=1)] | None = None
    idle_timeout_s: Annotated[int, Field(ge=1)] | None = None
    labels: Annotated[
        dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=256)]], Field(max_length=32)
    ] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    # enforce: refuse what the allowlist does not allow; report: allow it, and log what would be refused.
    egress_mode: EgressMode | None = None
    # A hermetic replay: the proxy answers only from these recorded responses (POST /v1/replay-responses)
    # and has no route out.
    hermetic: Annotated[str, Field(pattern=r"^rsp_[0-9a-f]{16}$")] | None = None
    # The recording's byte budget for events and frames (CORRAL_RECORDING_BUDGET_MB when unset),
    # held to CORRAL_RECORDING_MAX_BUDGET_MB.
    recording_mb: Annotated[int, Field(ge=1)] | None = None
    # Brokered secrets: the sandbox holds placeholders, the proxy puts the values in (docs/secrets.md).
    secrets: CreateSecrets = Field(default_factory=dict)
    # Environment variables in every command the agent runs (docs/environments.md); never a secret's value.
    env: EnvVars = Field(default_factory=dict)
    # A workspace volume of this key's (POST /v1/volumes), mounted at /workspace for this session alone.
    volume: VolumeName | None = None
    # A template to start from (docs/environments.md): NAME (its newest version) or NAME:VERSION.
    template: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    # A saved browser profile loaded into the browser (docs/environments.md#browser-profiles).
    profile: ProfileRef | None = None
    # What an idle timeout does: end the session, or pause it (resumed later by POST .../resume).
    idle_action: IdleAction = "end"


class ResumeSession(BaseModel):
    """POST /v1/sessions/{id}/resume: nothing, or the secret values a restarted gateway no longer holds."""

    model_config = ConfigDict(extra="forbid")
    secrets: Annotated[dict[SecretName, SecretValue], Field(max_length=MAX_SECRETS)] = Field(default_factory=dict)


class UpdateSession(BaseModel):
    """PATCH /v1/sessions/{id}: change the live allowlist, egress mode or secrets, or the session's
    remaining lifetime (each change is audited)."""

    model_config = ConfigDict(extra="forbid")
    allow: Annotated[list[HostPattern], Field(max_length=256)] | None = None
    egress_mode: EgressMode | None = None
    secrets: UpdateSecrets | None = None
    # The session's new remaining lifetime, counted from now (E2B's set_timeout): at most
    # CORRAL_MAX_TIMEOUT_S; it may extend the session or shorten it.
    timeout_s: Annotated[int, Field(ge=1)] | None = None

    @property
    def changes_egress(self) -> bool:
        """Whether it changes the allowlist, mode or secrets: a PATCH of ``timeout_s`` alone does not;
        an empty one sets the policy again, as it did before ``timeout_s`` existed."""
        return (
            self.allow is not None
            or self.egress_mode is not None
            or self.secrets is not None
            or not self.changes_lifetime
        )

    @property
    def changes_lifetime(self) -> bool:
        return self.timeout_s is not None


# pausing, paused, resuming: corral.gateway.sessions.pausing (docs/environments.md, "Pause and resume").
SessionState = Literal["starting", "ready", "stopping", "pausing", "paused", "resuming"]


# A session's fields, each declared once, in three layers: what its recording's manifest keeps, what
# its owner sees, and (corral.gateway.sessions.records.SessionRecord) what the gateway keeps about it.


class SessionSetup(BaseModel):
    """What a session was made with: written in its recording's manifest (enough to replay it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    created_at: float
    viewport: Viewport
    allow: list[str]
    egress_mode: EgressMode | None = None
    hermetic: bool = False  # its proxy answers only from recorded responses
    labels: dict[str, str]

    def manifest(self) -> dict[str, Any]:
        """The setup as a recording's manifest holds it (only these fields, whatever the subclass)."""
        return self.model_dump(mode="json", include=set(SessionSetup.model_fields))


class SessionTerms(SessionSetup):
    """What its owner sees of a session besides its live state: its limits and where it came from."""

    id: str
    expires_at: float
    idle_timeout_s: int
    from_pool: bool
    # The names of its environment variables (``env`` at create); their values are never shown.
    env: list[str] = Field(default_factory=list)
    volume: str | None = None  # the workspace volume it holds (docs/environments.md)
    template: str | None = None  # NAME:VERSION, as resolved at create
    profile: ProfileRef | None = None  # the browser profile it loaded, and whether it saves it
    idle_action: IdleAction = "end"
    paused_at: float | None = None  # while paused: when; its remaining time does not run meanwhile


class SessionOut(SessionTerms):
    """A session as the API answers it: its terms, its state and its addresses."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    state: SessionState
    last_activity_at: float
    container: str  # the sandbox's name
    # The machine its sandbox runs on, as the runtime names it (a Swarm node's host name; "" on a
    # single-host runtime, and while paused: no sandbox).
    node: str = ""
    ws_url: str
    actions_url: str
    traffic_url: str
    secrets: dict[str, str] = Field(default_factory=dict)  # name -> placeholder (never a value)


class CreatedSession(SessionOut):
    token: str


class ReplayResponsesOut(BaseModel):
    id: str
    flows: int
    bytes: int
    torn: bool  # the last flow was cut short (a killed proxy) and left out


class CreateLink(BaseModel):
    """POST /v1/sessions/{id}/links: a viewer link to watch or step into the session."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["view", "control"]
    ttl_s: Annotated[int, Field(ge=1, le=86400)] = 3600


class CdpConnect(BaseModel):
    """POST /v1/sessions/{id}/cdp/connect: a signed CDP address for clients that cannot set a header."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ttl_s: Annotated[int, Field(ge=1, le=MAX_TTL_S)] = 60
    exclusive: bool = False


class _Link(BaseModel):
    """What every answer about a viewer link says of it (its fields first, in this order)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    mode: Literal["view", "control"]
    created_at: float
    expires_at: float


class LinkOut(_Link):
    """A viewer link as its listing shows it (never its secret)."""

    revoked_at: float | None
    last_used_at: float | None
    streams: int  # live streams open with it now


class CreatedLink(_Link):
    """A new viewer link: ``url`` holds its secret in the fragment, shown this once."""

    url: str


class RevokedLink(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    revoked_at: float


def _previewable(port: int) -> int:
    """A port a preview may reach (corral.contracts.previews.port_problem: not a reserved one)."""
    problem = port_problem(port)
    if problem is not None:
        raise ValueError(problem)
    return port


class CreatePreview(BaseModel):
    """POST /v1/sessions/{id}/previews: a URL for a server the agent runs on ``port`` in the sandbox."""

    model_config = ConfigDict(extra="forbid")
    port: Annotated[int, Field(ge=1, le=65535), AfterValidator(_previewable)]
    ttl_s: Annotated[int, Field(ge=1, le=86400)] = 3600  # capped at the session's end


class _Preview(BaseModel):
    """What every answer about a port preview says of it (its fields first, in this order)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    port: int
    host: str  # {port}-{session hex}.{CORRAL_PREVIEW_DOMAIN}:{CORRAL_PREVIEW_PORT}
    created_at: float
    expires_at: float


class CreatedPreview(_Preview):
    """A new preview: ``url`` holds its secret (``?corral_preview_token=crl_prev_...``), shown this once."""

    url: str


class PreviewOut(_Preview):
    """A preview as its listing shows it (never its secret)."""

    revoked_at: float | None
    last_used_at: float | None
    connections: int  # client connections opened through it in all
    open_connections: int  # of them open now
    bytes_in: int  # from clients to the sandbox's server
    bytes_out: int  # from the server to clients


class PreviewListing(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    previews: list[PreviewOut]


class RevokedPreview(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    revoked_at: float
