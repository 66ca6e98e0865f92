"""The gateway's HTTP answers and request bodies as the client side reads and writes them (pure):
a session (:class:`SessionInfo`), an audit record (:class:`TrafficRecord`), a file written by an
upload (:class:`UploadedFile`), a port preview (:class:`Preview`), and the bodies of a create and of a secret's change.

The client's own models, not the gateway's (``corral.gateway.models`` is the server's and pulls
its settings and the proxy's policy): an install for the SDK carries pydantic only. They keep
what a newer gateway adds (``extra="allow"``), so ``corral session show --json`` prints it whole.
"""

from __future__ import annotations

from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field

from corral.contracts.previews import SANDBOX_PREVIEW_PORT


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    def wire(self) -> dict[str, object]:
        """As the gateway sent it (for ``--json`` and the MCP tools' structured content)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class ViewportSize(_Answer):
    width: int
    height: int


class SessionProfile(_Answer):
    """The browser profile a session loaded, and whether it saves it at its end."""

    name: str
    save: bool = False


class SessionInfo(_Answer):
    """A session as the gateway shows it to its owner (``GET /v1/sessions/{id}``, a listing's row, a
    PATCH's answer); ``token`` only in the answer to its create (the session's credential, shown once)."""

    id: str
    state: str = "ready"  # starting, ready, stopping, pausing, paused, resuming
    container: str = ""  # the sandbox's name (docker exec, logs)
    node: str = ""  # the machine it runs on (a Swarm node's host name; "" on a single-host gateway)
    ws_url: str = ""
    actions_url: str = ""
    traffic_url: str = ""
    allow: list[str] = Field(default_factory=list)
    egress_mode: str | None = None
    hermetic: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    viewport: ViewportSize | None = None
    created_at: float = 0.0
    expires_at: float = 0.0
    idle_timeout_s: int = 0
    last_activity_at: float = 0.0
    from_pool: bool = False
    secrets: dict[str, str] = Field(default_factory=dict)  # name -> placeholder (never a value)
    env: list[str] = Field(default_factory=list)  # its environment variables' names (never their values)
    volume: str | None = None  # the workspace volume it holds
    template: str | None = None  # NAME:VERSION it started from
    profile: SessionProfile | None = None  # the browser profile it loaded, and whether it saves it
    idle_action: str = "end"  # what its idle timeout does: end or pause
    paused_at: float | None = None  # while paused
    token: str | None = None

    def shown(self) -> dict[str, object]:
        """The session less its credential, as JSON: what a model (MCP) or a log may see."""
        return self.model_dump(mode="json", by_alias=True, exclude={"token"}, exclude_unset=True)


class TrafficRecord(_Answer):
    """One line of a session's egress audit log (``GET /v1/sessions/{id}/traffic``): the chain's
    fields, then what its event carries (docs/egress.md has every event's fields; an event's others
    are kept as extras, read as attributes or with :meth:`get`)."""

    seq: int = 0
    time: float = 0.0  # unix seconds
    session: str = ""
    event: str = ""
    prev: str = ""
    hash: str = ""
    host: str | None = None
    port: int | None = None
    method: str | None = None
    url: str | None = None
    status: int | None = None
    decision: str | None = None
    rule: str | None = None
    reason: str | None = None
    action: str | None = None
    actor: str | None = None

    def get(self, name: str, default: object = None) -> object:
        """A field by name, declared or extra, else ``default``."""
        if name in type(self).model_fields:
            return getattr(self, name)
        return (self.model_extra or {}).get(name, default)


class VolumeInfo(_Answer):
    """A workspace volume (``/v1/volumes``): its quota, what its filesystem uses, who holds it."""

    name: str
    size_mb: int
    used_bytes: int = 0
    in_use_by: str | None = None  # the session holding it, or None
    created_at: float = 0.0


class UploadedFile(_Answer):
    """A file an upload wrote (``PUT /v1/sessions/{id}/files``)."""

    path: str
    size: int
    sha256: str


# A secret in a create's ``secrets``, or its change in a PATCH (what is given): its value, the hosts it
# may go to, and where in a request (``in`` is a keyword: hence the functional form).
SecretChange = TypedDict("SecretChange", {"value": str, "allow": list[str], "in": list[str]}, total=False)


class ViewportBody(TypedDict):
    width: int
    height: int


class ProfileBody(TypedDict):
    """A create's ``profile``: the saved browser profile to load, and whether the session saves it."""

    name: str
    save: bool


class ProfileInfo(_Answer):
    """A saved browser profile (``GET /v1/profiles``): never its contents."""

    name: str
    size: int = 0  # the archive's bytes, before encryption
    saved_at: float = 0.0


class SessionBody(TypedDict, total=False):
    """The body of ``POST /v1/sessions``: what was given, nothing else (the gateway has the defaults)."""

    allow: list[str]
    labels: dict[str, str]
    secrets: dict[str, SecretChange]
    egress_mode: str
    hermetic: str
    viewport: ViewportBody
    timeout_s: int
    idle_timeout_s: int
    env: dict[str, str]
    volume: str
    template: str
    profile: ProfileBody
    idle_action: str


class TemplateVersionInfo(_Answer):
    """One version of a template (``GET /v1/templates/{name}``'s ``versions``)."""

    version: int
    image: str
    image_id: str = ""
    created_at: float = 0.0
    size: int = 0
    env: dict[str, str] = Field(default_factory=dict)


class TemplateInfo(_Answer):
    """A template: every key may start sessions from it; ``mine``: this key built it (rebuilds, deletes)."""

    name: str
    latest: int
    mine: bool = False
    versions: list[TemplateVersionInfo] = Field(default_factory=list)


class BuiltTemplate(TemplateVersionInfo):
    """A build's last line: the version it made, or gave back from the cache (``cached``)."""

    name: str
    cached: bool = False


class PreviewInfo(_Answer):
    """A port preview as its listing shows it (``GET /v1/sessions/{id}/previews``): never its secret."""

    id: str
    port: int
    host: str
    created_at: float = 0.0
    expires_at: float = 0.0
    revoked_at: float | None = None
    last_used_at: float | None = None
    connections: int = 0  # client connections opened through it in all
    open_connections: int = 0  # of them open now
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def sandbox_url(self) -> str:
        """The address the sandbox's own browser opens (no secret asked there: docs/previews.md)."""
        return sandbox_url(self.host)


class Preview(_Answer):
    """A preview just made (``POST /v1/sessions/{id}/previews``): ``url`` carries its secret, shown
    this once (like a viewer link's); the listing never shows it again."""

    id: str
    port: int
    host: str
    url: str
    created_at: float = 0.0
    expires_at: float = 0.0

    @property
    def sandbox_url(self) -> str:
        """The address the sandbox's own browser opens (no secret asked there: docs/previews.md)."""
        return sandbox_url(self.host)

    def shown(self) -> dict[str, object]:
        """As the gateway sent it, with :attr:`sandbox_url` (the CLI's ``--json``, the MCP tool's answer)."""
        return {**self.wire(), "sandbox_url": self.sandbox_url}


class RevokedPreview(_Answer):
    """A revoked preview (``DELETE /v1/sessions/{id}/previews/{preview_id}``): its open connections close."""

    id: str
    revoked_at: float = 0.0


def sandbox_url(host: str) -> str:
    """``{port}-{hex}.{domain}[:port]`` -> the same preview's address on the sandbox's own loopback
    (``http://{port}-{hex}.localhost:8701/``, corral.sandbox.previewdoor), whatever the gateway's
    domain and port: the first label of the gateway's host names it."""
    label = host.split(".", 1)[0]
    return f"http://{label}.localhost:{SANDBOX_PREVIEW_PORT}/"


__all__ = [
    "BuiltTemplate",
    "Preview",
    "PreviewInfo",
    "ProfileBody",
    "ProfileInfo",
    "RevokedPreview",
    "SecretChange",
    "SessionBody",
    "SessionInfo",
    "SessionProfile",
    "TemplateInfo",
    "TemplateVersionInfo",
    "TrafficRecord",
    "UploadedFile",
    "ViewportSize",
    "VolumeInfo",
    "sandbox_url",
]
