"""What a paused session's record keeps of it (in ``SessionRecord.paused``): when it paused, the time
it had left, its open tabs and the sizes of what was saved; never the saved bytes themselves (opaque
blobs beside the records: corral.gateway.sessions.savedstate)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PausedTab(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    url: str = Field(max_length=65_536)
    active: bool = False


class PausedState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    paused_at: float
    remaining_s: float  # of its wall-clock timeout: paused time does not count (as E2B's)
    tabs: list[PausedTab] = Field(default_factory=list, max_length=256)
    archives: dict[str, int] = Field(default_factory=dict)  # directory in the sandbox -> bytes saved
    browser_bytes: int | None = None  # what the browser-state seam saved, if anything
