"""Corral's exception hierarchy, drawn in one place.

Every failure an agent can cause or meet maps to one stable ``code``; the
dispatcher turns an :class:`ActionError` into an ``{"ok": false, ...}`` reply
and the connection carries on.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Stable error codes of the wire protocol (documented in docs/protocol.md)."""

    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    MESSAGE_TOO_LARGE = "message_too_large"
    UNKNOWN_ACTION = "unknown_action"
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"
    INVALID_FIELD = "invalid_field"
    OUT_OF_BOUNDS = "out_of_bounds"
    UNKNOWN_KEY = "unknown_key"
    TEXT_TOO_LONG = "text_too_long"
    UNSUPPORTED = "unsupported"
    TIMEOUT = "timeout"
    BROWSER_UNAVAILABLE = "browser_unavailable"
    NAVIGATION_FAILED = "navigation_failed"
    NO_SUCH_TAB = "no_such_tab"
    CLIPBOARD_FAILED = "clipboard_failed"
    INTERNAL = "internal"
    # The controller's door (corral.sandbox.guard): browsers, callers without its secret, wrong media types.
    FORBIDDEN = "forbidden"
    UNAUTHORIZED = "unauthorized"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"


class CorralError(Exception):
    """Base of every error Corral raises on purpose."""


class ActionError(CorralError):
    """An action could not be carried out; becomes a structured failure reply.

    ``field`` is a dotted path into the request (``action.x``, ``anthropic.coordinate``,
    ``openai[2].keys``) when one field is to blame.
    """

    def __init__(self, code: ErrorCode, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

    def to_dict(self) -> dict[str, str]:
        out = {"code": str(self.code), "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out

    def __repr__(self) -> str:
        return f"ActionError({self.code!s}, {self.message!r}, field={self.field!r})"


class SandboxError(CorralError):
    """The host side could not build, start or reach a sandbox."""


class UnprovenController(SandboxError):
    """What answered on a sandbox's controller port could not prove the controller's per-boot secret:
    not one byte of its answer is believed (an impostor bound to the port, or a controller of another boot)."""


class ImageBuildError(SandboxError):
    """Building an image (or its Debian base) failed."""
