"""The settings of port previews (docs/previews.md): their listener, domain and bounds. A base of
:class:`~corral.gateway.settings.GatewaySettings`, which reads them from ``CORRAL_*`` alike; apart
only so that no class holds everything."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings


class PreviewSettings(BaseSettings):
    preview_port: int = Field(
        default=8701,
        ge=0,
        le=65535,
        description=(
            "Port previews' own listener, on `CORRAL_HOST` ([previews.md](previews.md)): never the API's port, and it "
            "serves no API; 0 turns previews off."
        ),
    )
    preview_domain: str = Field(
        default="localhost",
        description=(
            "The domain of previews' host names, `{port}-{session hex}.{domain}` (browsers resolve `*.localhost` to "
            "loopback); another name needs a wildcard DNS entry pointing at the gateway."
        ),
    )
    preview_max_body_mb: int = Field(
        default=64, ge=1, description="A request body sent to a preview above this is refused (413)."
    )
    preview_max_header_kb: int = Field(
        default=32, ge=1, description="A request's line and headers to a preview above this are refused (431)."
    )
    preview_max_connections: int = Field(
        default=64, ge=1, description="Connections open at once to one preview (past it: 429)."
    )
    preview_idle_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="A preview connection with no byte either way for this long is closed (a WebSocket's too).",
    )
