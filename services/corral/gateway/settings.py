"""The gateway's settings (``CORRAL_*``), injected into the app; never a module global.

Each field's ``description`` is what docs/gateway.md's settings table says of it: the table is
generated from this model (corral.gateway.settingsdoc) and a test holds the two together."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from corral.errors import WeakApiKey
from corral.gateway import keystrength
from corral.gateway.downloadsettings import DownloadSettings
from corral.gateway.environmentsettings import EnvironmentSettings
from corral.gateway.previewsettings import PreviewSettings
from corral.gateway.swarmsettings import SwarmSettings

ENV_PREFIX = "CORRAL_"


def env_name(field: str) -> str:
    """The environment variable a field is read from (``max_sessions`` → ``CORRAL_MAX_SESSIONS``)."""
    return f"{ENV_PREFIX}{field.upper()}"


class GatewaySettings(EnvironmentSettings, PreviewSettings, DownloadSettings, SwarmSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    host: str = Field(
        default="127.0.0.1",
        description=(
            "The address the API listens on (`corral up`'s gateway shares the host's network: keep it on loopback "
            "unless something in front guards it)."
        ),
    )
    port: int = Field(default=8700, description="The API's port.")
    data_dir: Path = Field(
        default=Path.home() / ".local" / "share" / "corral",
        description=(
            "Session records, egress state and audit logs, recordings, the generated API key (see *The data "
            "directory*); under `corral up` the same path inside the container and out (default there "
            "`/var/lib/corral`)."
        ),
    )
    api_key: str = Field(
        default="",
        description=(
            "API keys, comma-separated, each strong enough to hold against a guess (see *Auth*); when empty, one key "
            "is generated on first start and kept in the data dir."
        ),
    )
    runtime: str = Field(
        default="docker",
        description=(
            "Where sandboxes run: the runtime driver (`corral.runtime.open_runtime`): `docker` (one host) or `swarm` "
            "(a Docker Swarm through its manager at `DOCKER_HOST`, [swarm.md](swarm.md)); any other value stops the "
            "gateway at start ([kubernetes.md](kubernetes.md))."
        ),
    )
    image: str = Field(default="corral-desktop:latest", description="The sandboxes' image.")
    network: str = Field(
        default="corral-sandboxes", description="The shared Docker network of sandboxes without egress control."
    )
    instance: str = Field(
        default="default",
        description=(
            "This gateway's name on the host: it labels what it starts and removes only its own (one gateway per "
            "instance)."
        ),
    )

    max_sessions: int = Field(default=8, ge=1, description="Sessions at once, all keys together (past it: 429).")
    max_sessions_per_key: int = Field(default=8, ge=1, description="Sessions at once per API key (past it: 429).")
    pool_size: int = Field(
        default=1, ge=0, description="Sandboxes kept started and ready for the next session (the warm pool)."
    )
    ground_pool_size: int = Field(
        default=2,
        ge=0,
        description=(
            "Session networks and CAs made ahead (`corral.gateway.grounds`) for cold starts with egress control."
        ),
    )
    ground_proxies: bool = Field(
        default=True,
        description=(
            "Each ground's proxy started ahead too (enforce, nothing allowed): a cold start then starts only its "
            "sandbox and sets the policy; hermetic sessions start their own proxy still."
        ),
    )

    default_timeout_s: int = Field(default=3600, description="A session's wall-clock lifetime when it asks for none.")
    max_timeout_s: int = Field(
        default=24 * 3600, description="The longest `timeout_s` a session may ask for (over it: 422)."
    )
    default_idle_timeout_s: int = Field(
        default=600, description="A session with no action this long ends, unless it asks otherwise."
    )
    reap_interval_s: float = Field(
        default=1.0, description="How often sessions are checked for their timeouts and for a dead sandbox or proxy."
    )
    start_timeout_s: float = Field(default=60.0, description="How long a sandbox may take to start and answer.")
    shutdown_grace_s: int = Field(
        default=8,
        ge=1,
        description=(
            "On stop, open requests (an MCP client's event stream, a long exec) get this long to end before they are "
            "cancelled and the sessions stopped: without a bound one held-open stream keeps the gateway up."
        ),
    )

    default_cpus: float | None = Field(
        default=None,
        gt=0,
        description=(
            "A sandbox's CPUs when the session asks for none. Unset: sized to the host at start "
            "(`corral.gateway.limits`): every core but half of one, at most two."
        ),
    )
    max_cpus: float = Field(default=2.0, description="The most CPUs a session may ask for.")
    default_memory_mb: int | None = Field(
        default=None,
        ge=256,
        description=(
            "A sandbox's memory (swap equal) when the session asks for none. Unset: sized so that every session and "
            "pooled pair at the cap fits the host's memory, 768-1536 MiB."
        ),
    )
    max_memory_mb: int = Field(default=4096, description="The most memory a session may ask for.")
    default_pids: int = Field(default=512, description="A sandbox's process limit.")
    default_shm_mb: int = Field(default=256, description="A sandbox's `/dev/shm`.")
    default_disk_mb: int = Field(default=1024, description="A sandbox's writable disk when the session asks for none.")
    max_disk_mb: int = Field(default=8192, description="The most writable disk a session may ask for.")
    workspace_size: str = Field(
        default="1g",
        pattern=r"^[0-9]+[kmg]?$",
        description=(
            "Each sandbox's `/workspace`, the tmpfs the agent's commands start in (Docker's size syntax: `512m`, `1g`)."
        ),
    )
    max_body_kb: int = Field(
        default=1024,
        ge=1,
        description="JSON bodies of the API (create, change a session) above this are refused (413) unread.",
    )
    mcp_allowed_hosts: str = Field(
        default="",
        description=(
            "`/mcp`'s DNS-rebinding guard: the names (comma-separated, with or without a port) clients reach the "
            "gateway by besides the loopback ones; `*` turns the check off (a reverse proxy owns the `Host` header). "
            "See [mcp.md](mcp.md)."
        ),
    )
    mcp_max_sessions: int = Field(
        default=256, ge=1, description="`/mcp`'s sessions (one per connected MCP client) open at once."
    )
    mcp_max_sessions_per_caller: int = Field(
        default=16,
        ge=1,
        description="`/mcp`'s sessions open at once per credential (an API key, or a session's token).",
    )
    mcp_session_idle_s: float = Field(
        default=600.0,
        gt=0,
        description="An `/mcp` session is closed after this long without a request or an open stream.",
    )
    max_upload_bytes: int = Field(
        default=1 << 30,
        ge=1,
        description=(
            "A file uploaded into a session (`PUT /v1/sessions/{id}/files`) above this is refused (413), nothing kept."
        ),
    )
    max_download_bytes: int = Field(
        default=1 << 30,
        ge=1,
        description=(
            "A file or directory downloaded from a session (`GET /v1/sessions/{id}/files`) above this is refused "
            "(413) when its size is known up front, else cut where it passes this."
        ),
    )
    controller_max_restarts: int = Field(
        default=5,
        ge=1,
        description=(
            "A session whose controller restarts more than this often within `CORRAL_CONTROLLER_RESTART_WINDOW_S` is "
            "ended (`controller_dead`): its init cannot keep it up."
        ),
    )
    controller_restart_window_s: float = Field(
        default=300.0, gt=0, description="The window `CORRAL_CONTROLLER_MAX_RESTARTS` counts in."
    )
    controller_dead_after_s: float = Field(
        default=60.0,
        gt=0,
        description="A session whose controller does not answer this long is ended (`controller_dead`).",
    )

    egress: bool = Field(
        default=True,
        description=(
            "Every session's traffic goes through its own proxy (corral-egress) on a network of its own; off only "
            "where sandboxes may reach the network unfiltered (and unlogged)."
        ),
    )
    egress_image: str = Field(default="corral-egress:latest", description="The egress proxies' image.")
    egress_network: str = Field(default="corral-egress", description="The proxies' shared network (their way out).")
    session_subnets: str = Field(
        default="10.213.0.0/16",
        description="Each session's own network gets a /28 from here (pick a range your hosts do not use).",
    )
    egress_mode: Literal["enforce", "report"] = Field(
        default="enforce",
        description=(
            "`enforce` refuses what the allowlist does not allow; `report` lets it through and logs it (a session may"
            " choose its own)."
        ),
    )
    egress_trusted_networks: str = Field(
        default="",
        description=(
            "Comma-separated networks the operator vouches for: exempt from the global deny of private ranges "
            "([egress.md](egress.md))."
        ),
    )
    egress_allow_private: bool = Field(default=False, description="Lifts the global deny of private ranges altogether.")
    egress_upstream_ca: Path | None = Field(
        default=None,
        description=(
            "A CA bundle (a file on the host) the proxies trust for upstreams beside the public ones (an internal "
            "PKI, a test CA); `corral up` mounts it into the gateway read-only."
        ),
    )
    egress_retention_days: float = Field(default=30.0, gt=0, description="Audit logs outlive their sessions this long.")
    audit_max_bytes: int = Field(
        default=64 << 20,
        ge=16 << 10,
        description=(
            "Each session's audit log: past this many bytes its proxy writes one `budget` record, then counts "
            "(`tally` records per host, event and decision) instead of traffic records "
            "([egress.md](egress.md#the-audit-log))."
        ),
    )
    egress_uid: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The host uid the proxies run as (they own their state dirs). Unset: 1001 when the gateway runs as root, "
            "else the gateway's own uid (only root can give files to another user)."
        ),
    )

    record: bool = Field(default=True, description="Every session is recorded ([recording.md](recording.md)).")
    recording_retention_days: float = Field(
        default=30.0, gt=0, description="Recordings outlive their sessions this long."
    )
    recording_budget_mb: int = Field(
        default=256,
        ge=1,
        description=(
            "Each session's bytes of events and frames; past it the recording notes the cut and stores no more (the "
            "session goes on). A session may ask for another budget (`recording_mb`), up to the cap."
        ),
    )
    recording_max_budget_mb: int = Field(
        default=2048, ge=1, description="The largest recording budget a session may ask for."
    )
    recording_max_text_kb: int = Field(
        default=64,
        ge=1,
        description="Per event, each field of recorded text (request, native, reply...) is kept up to this much.",
    )
    recordings_max_total_mb: int = Field(
        default=10240,
        ge=1,
        description="All recordings in the data dir together; past it, ended ones go, oldest first.",
    )
    record_responses: bool = Field(
        default=True,
        description="Each session's upstream answers go into its recording (`responses.mitm`) for hermetic replays.",
    )
    responses_max_body_mb: int = Field(default=16, ge=1, description="A recorded answer's body above this is left out.")
    responses_max_total_mb: int = Field(default=256, ge=1, description="Each session's recorded answers together.")
    replay_upload_max_mb: int = Field(
        default=256,
        ge=1,
        description=(
            "Recorded responses uploaded for hermetic replays (`POST /v1/replay-responses`) above this are refused "
            "(413)."
        ),
    )
    replay_upload_retention_hours: float = Field(
        default=24.0, gt=0, description="Uploaded recorded responses are kept this long."
    )

    def api_keys(self) -> list[str]:
        """The keys of ``CORRAL_API_KEY``; :class:`WeakApiKey` when one is too short or too guessable
        to hold (corral.gateway.keystrength: the message says why and what to use)."""
        keys = [key.strip() for key in self.api_key.split(",") if key.strip()]
        trouble = keystrength.problem(keys)
        if trouble is not None:
            raise WeakApiKey(trouble, field="CORRAL_API_KEY")
        return keys
