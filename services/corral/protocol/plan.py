"""What a parsed request asks the sandbox to do: native steps plus after-action options."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from corral.protocol.actions import NativeAction, ScreenshotOptions
from corral.protocol.geometry import Scale
from corral.protocol.results import AnyResult

if TYPE_CHECKING:
    from corral.protocol.vendor.calls import VendorCall

RequestId = str | int | None


class Dialect(StrEnum):
    NATIVE = "action"
    ANTHROPIC = "anthropic"
    OPENAI = "openai"


@dataclass(frozen=True, slots=True)
class Step:
    """One native action and the request field it came from (for error paths)."""

    action: NativeAction
    field: str


@dataclass(frozen=True, slots=True)
class After:
    """What happens once the steps ran: an optional screenshot, taken at once or once the screen is stable."""

    screenshot: ScreenshotOptions | None = None
    wait_for_stable: bool = False
    settle_timeout_ms: int = 3_000
    settle_quiet_ms: int = 120
    settle_min_ms: int = 300


@dataclass(frozen=True, slots=True)
class Plan:
    request_id: RequestId
    dialect: Dialect
    steps: tuple[Step, ...]
    after: After
    timeout_ms: int
    scale: Scale | None = None
    call: VendorCall | None = None  # a whole vendor block or item: the reply is the vendor's result
    wait_for_control_ms: int = 0  # how long the agent's request waits for the control lease


@dataclass(frozen=True, slots=True)
class EncodedImage:
    """A screenshot as sent on the wire (``data`` is the encoded file, not yet base64)."""

    media_type: str
    data: bytes
    width: int
    height: int
    settle_ms: float | None = None
    settled: bool | None = None


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What one native action produced: its result model (:mod:`corral.protocol.results`) and, for a
    screenshot or a zoom, its image."""

    result: AnyResult
    image: EncodedImage | None = None

    @property
    def data(self) -> dict[str, Any]:
        """The result as a native reply's ``result`` carries it (JSON-ready; what the vendors' forms read)."""
        return self.result.wire()
