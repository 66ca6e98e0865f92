"""The gateway's request and response bodies."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

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


class Viewport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: Annotated[int, Field(ge=320, le=3840)] = 1280
    height: Annotated[int, Field(ge=240, le=2160)] = 800


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpus: Annotated[float, Field(gt=0, le=64)] | None = None
    memory_mb: Annotated[int, Field(ge=256, le=65536)] | None = None
    disk_mb: Annotated[int, Field(ge=64, le=65536)] | None = None


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


class UpdateSession(BaseModel):
    """PATCH /v1/sessions/{id}: change the live allowlist or egress mode (the change is audited)."""

    model_config = ConfigDict(extra="forbid")
    allow: Annotated[list[HostPattern], Field(max_length=256)] | None = None
    egress_mode: EgressMode | None = None


SessionState = Literal["starting", "ready", "stopping"]


# A session's fields, each declared once, in three layers: what its recording's manifest keeps, what
# its owner sees, and (corral.gateway.sessions.SessionRecord) what the gateway keeps about it.


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


class SessionOut(SessionTerms):
    """A session as the API answers it: its terms, its state and its addresses."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    state: SessionState
    last_activity_at: float
    container: str  # the sandbox's name
    ws_url: str
    actions_url: str
    traffic_url: str


class CreatedSession(SessionOut):
    token: str


class ReplayResponsesOut(BaseModel):
    id: str
    flows: int
    bytes: int
    torn: bool  # the last flow was cut short (a killed proxy) and left out
