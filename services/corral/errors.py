"""Corral's exception hierarchy, drawn in one place.

Every failure an agent or a client can cause or meet maps to one stable ``code``
(:class:`ErrorCode`) and travels as one JSON body, from the controller and the gateway alike
(:func:`error_body`): ``{"ok": false, "error": {"code", "message", "field"?}}``. The dispatcher
turns an :class:`ActionError` into such a reply and the connection carries on; the gateway answers
each :class:`CodedError` with the HTTP status its table gives the class (corral.gateway.routes.errors).

    CorralError
    ├─ CodedError (code, message, field)
    │   ├─ ActionError                      an action could not be carried out (the code per instance)
    │   ├─ InvalidRequest → InvalidCursor    a request the gateway refuses as written
    │   ├─ Unauthorized, Forbidden          credentials
    │   ├─ NotFound → SessionNotFound, ReplayNotFound, ProfileNotFound
    │   ├─ SessionPaused, SessionNotPaused, PausedCapacityError, SecretsMissing   pause and resume
    │   ├─ MessageTooLarge, UploadTooLarge, DownloadTooLarge
    │   ├─ CapacityError, HermeticUnavailable, EgressOff, ReplayUnreadable
    │   ├─ ProfilesOff, ProfileTooLarge, ProfileUnreadable, ProfileRefused   saved browser profiles
    │   ├─ AuditLogUnreadable, AuditAnchorsInvalid, TicketKeyUnusable, KeyIdKeyUnusable, WeakApiKey
    │   ├─ FileRefused → NoSuchFile, FileAccessDenied, NotADirectory, IsADirectory, InvalidPath, NoSpace
    │   ├─ BundleError                      not a readable recording
    │   └─ SandboxError                     the host side could not build, start or reach a sandbox
    │       ├─ SandboxStartFailed, UnprovenController, SandboxUnreachable, EgressUnavailable
    │       └─ ImageBuildError
    ├─ CommandFailed                        a command's ExecResult.check(): non-zero, killed, or out of time
    ├─ SettingsFileInvalid                  `corral up`'s env file refused, every SettingProblem in it
    ├─ StateRefused → StateTooLarge, BrowserStuck, StreamLimit   a browser state moved in or out of a sandbox
    ├─ RemoteError (code as received)       a peer answered with a structured error
    │   ├─ ActionFailed                     a sandbox's ok: false (the protocol clients)
    │   ├─ GatewayError                     the gateway's refusal (its client: the SDK and the CLI)
    │   └─ ControlError                     an egress proxy's refusal, or no proxy (its control channel)
    └─ UnknownKeyError, InvalidMessage, ReplyTooLarge   refusals of pure parsers, also ValueErrors
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict


class ErrorCode(StrEnum):
    """Stable error codes of the wire protocol and the gateway's API (docs/protocol.md, docs/gateway.md)."""

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
    URL_REFUSED = "url_refused"  # not a web page's address (corral.contracts.urls)
    CLIPBOARD_FAILED = "clipboard_failed"
    INTERNAL = "internal"
    # Commands, processes and files inside the sandbox (run as the agent's uid).
    PROGRAM_NOT_FOUND = "program_not_found"
    NO_SUCH_PROCESS = "no_such_process"
    PROCESS_LIMIT = "process_limit"
    EXEC_FAILED = "exec_failed"
    # run_code (corral.sandbox.kernels): a kernel that could not start, a context past the cap.
    KERNEL_FAILED = "kernel_failed"
    CODE_CONTEXT_LIMIT = "code_context_limit"
    NO_SUCH_FILE = "no_such_file"
    PERMISSION_DENIED = "permission_denied"
    NOT_A_DIRECTORY = "not_a_directory"
    IS_A_DIRECTORY = "is_a_directory"
    FILE_EXISTS = "file_exists"
    DIRECTORY_NOT_EMPTY = "directory_not_empty"
    NO_SPACE = "no_space"
    FILE_FAILED = "file_failed"
    # The tools over commands and files (the editor, patches) and the vendors' tool calls.
    NO_MATCH = "no_match"
    MULTIPLE_MATCHES = "multiple_matches"
    NOTHING_TO_UNDO = "nothing_to_undo"
    PATCH_FAILED = "patch_failed"
    UNKNOWN_TOOL = "unknown_tool"
    # The control lease (corral.sandbox.control.lease): a human or an exclusive CDP client holds the session.
    CONTROL_TAKEN = "control_taken"
    # The controller's door (corral.sandbox.guard): browsers, callers without its secret, wrong media types.
    FORBIDDEN = "forbidden"
    UNAUTHORIZED = "unauthorized"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    NOT_RECORDING = "not_recording"
    # The gateway's API (docs/gateway.md).
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    HTTP_ERROR = "http_error"
    TOO_LARGE = "too_large"
    TOO_MANY_SESSIONS = "too_many_sessions"
    EGRESS_OFF = "egress_off"
    SESSION_PAUSED = "session_paused"  # a paused session: resume it first (POST .../resume)
    SESSION_NOT_PAUSED = "session_not_paused"  # pause what runs, resume what is paused
    TOO_MANY_PAUSED = "too_many_paused"
    SECRETS_MISSING = "secrets_missing"  # a paused session's secret values are gone (a gateway restart)
    REPLAY_UNREADABLE = "replay_unreadable"
    SANDBOX_START_FAILED = "sandbox_start_failed"
    SANDBOX_UNREACHABLE = "sandbox_unreachable"
    CONTROLLER_UNPROVEN = "controller_unproven"
    EGRESS_UNAVAILABLE = "egress_unavailable"
    NOT_ON_THIS_RUNTIME = "not_on_this_runtime"  # an operation the runtime driver does not offer (swarm: volumes, ...)
    AUDIT_LOG_UNREADABLE = "audit_log_unreadable"
    AUDIT_ANCHORS_INVALID = "audit_anchors_invalid"
    IMAGE_BUILD_FAILED = "image_build_failed"
    VOLUME_IN_USE = "volume_in_use"
    VOLUME_EXISTS = "volume_exists"
    TOO_MANY_VOLUMES = "too_many_volumes"
    # Templates (corral.gateway.templates): a file that is no template, a build that failed at a step,
    # a template that would weaken the sandbox, one built on an older base.
    TEMPLATE_INVALID = "template_invalid"
    TEMPLATE_BUILD_FAILED = "template_build_failed"
    TEMPLATE_REFUSED = "template_refused"
    TEMPLATE_STALE = "template_stale"
    # Browser profiles (corral.gateway.profiles): off without CORRAL_PROFILE_KEY, unreadable, refused by a sandbox.
    PROFILES_OFF = "profiles_off"
    PROFILE_UNREADABLE = "profile_unreadable"
    PROFILE_REFUSED = "profile_refused"
    # Reading a recording bundle (corral replay, corral export).
    BUNDLE_UNREADABLE = "bundle_unreadable"
    # Port previews (corral.gateway.previews, docs/previews.md).
    NOTHING_LISTENING = "nothing_listening"  # no server on the previewed port inside the sandbox
    PREVIEW_UNREACHABLE = "preview_unreachable"  # the tunnel or the server's answer failed
    PREVIEW_GONE = "preview_gone"  # the preview's session ended: its previews with it
    TOO_MANY_CONNECTIONS = "too_many_connections"  # a preview's connection cap
    HEADERS_TOO_LARGE = "headers_too_large"
    # The browser's downloads (docs/downloads.md): no download by that id (or its file is gone), one
    # that has no whole file to give (still coming, cancelled, capped, or its file replaced).
    NO_SUCH_DOWNLOAD = "no_such_download"
    DOWNLOAD_UNAVAILABLE = "download_unavailable"


class ErrorDetail(TypedDict):
    """The ``error`` member of every error body: a stable code, a message, the field to blame."""

    code: str
    message: str
    field: NotRequired[str]


class ControlTakenDetail(ErrorDetail):
    holder: str
    since: float


class ErrorBody(TypedDict):
    ok: Literal[False]
    error: ErrorDetail


def error_body(code: str, message: str, field: str | None = None) -> ErrorBody:
    """The one JSON error body, from the gateway and the controller alike (a controller's action
    reply adds the request's ``id``)."""
    error: ErrorDetail = {"code": str(code), "message": message}
    if field:
        error["field"] = field
    return {"ok": False, "error": error}


class CorralError(Exception):
    """Base of every error Corral raises on purpose."""


class CodedError(CorralError):
    """A failure with a stable ``code`` (the class's, given as ``class X(CodedError, code=...)``,
    unless an instance says otherwise), a message for people and, when one field of a request is to
    blame, its dotted path."""

    code: ErrorCode = ErrorCode.INTERNAL
    field: str | None = None

    def __init_subclass__(cls, code: ErrorCode | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if field is not None:
            self.field = field

    def to_dict(self) -> ErrorDetail:
        """The ``error`` member of :func:`error_body`."""
        out: ErrorDetail = {"code": str(self.code), "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out


class ActionError(CodedError):
    """An action could not be carried out; becomes a structured failure reply.

    ``field`` is a dotted path into the request (``action.x``, ``anthropic.coordinate``,
    ``openai[2].keys``) when one field is to blame.
    """

    def __init__(self, code: ErrorCode, message: str, field: str | None = None) -> None:
        super().__init__(message, field)
        self.code = code
        self.field = field

    def __repr__(self) -> str:
        return f"ActionError({self.code!s}, {self.message!r}, field={self.field!r})"


class ControlTaken(ActionError):
    """Someone else holds the session's control lease (corral.sandbox.control.lease): a human with a control
    link or an exclusive CDP connection. The error names the holder and since when (unix seconds)."""

    def __init__(self, holder: str, since: float) -> None:
        super().__init__(
            ErrorCode.CONTROL_TAKEN, f"control of the session is held by {holder}; wait for it to be handed back"
        )
        self.holder = holder
        self.since = since

    def to_dict(self) -> ControlTakenDetail:
        return {**super().to_dict(), "holder": self.holder, "since": self.since}


_ERRNO_CODES: dict[int, ErrorCode] = {
    errno.ENOENT: ErrorCode.NO_SUCH_FILE,
    errno.EACCES: ErrorCode.PERMISSION_DENIED,
    errno.EPERM: ErrorCode.PERMISSION_DENIED,
    errno.EROFS: ErrorCode.PERMISSION_DENIED,
    errno.ENOTDIR: ErrorCode.NOT_A_DIRECTORY,
    errno.EISDIR: ErrorCode.IS_A_DIRECTORY,
    errno.EEXIST: ErrorCode.FILE_EXISTS,
    errno.ENOTEMPTY: ErrorCode.DIRECTORY_NOT_EMPTY,
    errno.ENOSPC: ErrorCode.NO_SPACE,
    errno.EDQUOT: ErrorCode.NO_SPACE,
    errno.EFBIG: ErrorCode.NO_SPACE,
    errno.EAGAIN: ErrorCode.PROCESS_LIMIT,
    errno.ESRCH: ErrorCode.NO_SUCH_PROCESS,
}


def os_error(exc: OSError, field: str | None = None, what: str | None = None) -> ActionError:
    """An OSError from a file or process operation done as the agent, as the action's failure:
    the errno's stable code (``file_failed`` for the rest), its reason, and the path it named."""
    code = _ERRNO_CODES.get(exc.errno or 0, ErrorCode.FILE_FAILED)
    reason = exc.strerror or type(exc).__name__
    subject = what if what is not None else (repr(exc.filename) if exc.filename is not None else "")
    return ActionError(code, f"{subject}: {reason}" if subject else reason, field)


class CommandFailed(CorralError):
    """A command run in a sandbox did not succeed (raised by ``ExecResult.check()``): ``status`` is what a
    shell would say (the exit code, 128 + a signal, 124 for a timeout), ``result`` the whole ExecResult."""

    def __init__(self, status: int, stderr: str, result: object) -> None:
        tail = stderr.strip()[-500:]
        super().__init__(f"the command exited {status}" + (f": {tail}" if tail else ""))
        self.status = status
        self.result = result


class SettingProblem(NamedTuple):
    """One thing wrong in the gateway's env file: where (its line, when it has one), the setting's name
    (when known) and what is wrong. Never the value, which may be a secret. (A NamedTuple: the
    sandbox's long-lived processes import this module and never dataclasses.)"""

    line: int | None
    name: str | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.name}: {self.message}" if self.name else f"{where}{self.message}"


class SettingsFileInvalid(CorralError):
    """``corral up``'s env file (corral.gateway.envfile) holds problems: all of them, found before anything starts."""

    def __init__(self, path: str, problems: Sequence[SettingProblem]) -> None:
        self.path = path
        self.problems = tuple(problems)
        count = f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"
        lines = "".join(f"\n  {problem}" for problem in self.problems)
        super().__init__(f"{path}: {count}, nothing was started:{lines}")


class ArchiveRefused(CorralError):
    """A downloaded directory's tar holds a member no honest ``tar -cf - .`` makes (an absolute or ``..``
    name, one twice, a hard link to no file before it), or ends early: nothing of it is unpacked."""


class BadKernelMessage(CorralError):
    """A Jupyter kernel (the agent's process) sent a message that is not one (corral.sandbox.kernels.wire):
    it is dropped, never half-read."""


class KernelGone(CorralError):
    """The kernel's process ended while the controller waited on it (corral.sandbox.kernels)."""


class StreamAborted(CorralError):
    """What fed a streamed HTTP body failed after its first byte went (the program behind it exited
    badly): the body is aborted without its clean end, so the client sees it cut short."""


class StateRefused(CorralError):
    """Inside the sandbox: a browser state's archive refused (a link, a path outside the profile's
    state, a corrupt stream; corral.sandbox.web.statearchive); the message says why, never a value."""


class StateTooLarge(StateRefused):
    """Inside the sandbox: a browser state over the cap it was given."""


class BrowserStuck(CorralError):
    """Inside the sandbox: Chromium would not stop for its state to be moved, or did not come back."""


class StreamLimit(CorralError):
    """An exec into a sandbox wrote more than it may (corral.runtime.docker.browserstate)."""


class RemoteError(CorralError):
    """Another party of Corral (the gateway, a controller, a proxy) answered with a structured error.

    Kept as received: ``code`` stays a string, since a newer peer may send a code this side does not
    know. The base of the SDK's and the client's errors and of the proxy control channel's.
    """

    def __init__(self, message: str, code: str = "", field: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field
        self.status = status


class ActionFailed(RemoteError):
    """A sandbox answered ``ok: false`` (raised by the protocol clients); ``error`` is its error member."""

    def __init__(self, error: Mapping[str, Any]) -> None:  # the error member as the sandbox sent it
        field = error.get("field")
        super().__init__(
            f"{error.get('code')}: {error.get('message')}" + (f" (field {field})" if field else ""),
            str(error.get("code", "")),
            str(field) if field else None,
        )
        self.error = error


class GatewayError(RemoteError):
    """The gateway refused a request (raised by its client, corral.gateway_client); ``status`` and
    ``code`` say why."""

    def __init__(self, status: int, body: Mapping[str, Any]) -> None:  # the body as the gateway sent it
        error = body.get("error") or {}
        field = error.get("field")
        super().__init__(
            f"{status} {error.get('code')}: {error.get('message')}",
            str(error.get("code", "")),
            str(field) if field else None,
            status,
        )


class ControlError(RemoteError):
    """An egress proxy refused a control message or could not be reached (corral.proxy.control).

    ``code``: the refusal's code when the proxy gave one (an ErrorCode value), else
    ``egress_unavailable``."""

    def __init__(self, message: str, code: str = ErrorCode.EGRESS_UNAVAILABLE, field: str | None = None) -> None:
        super().__init__(message, code, field)


# -- what a pure parser refuses (a ValueError too, for callers that only know that) ------------------------


class UnknownKeyError(CorralError, ValueError):
    """A key name that is no keysym, alias or single character (corral.protocol.keys)."""

    def __init__(self, token: str, combo: str) -> None:
        hint = f" in {combo!r}" if combo != token else ""
        super().__init__(
            f"unknown key {token!r}{hint}; use X keysym names (Return, Page_Down, F5, ctrl, shift, alt, super) "
            "joined with '+', e.g. 'ctrl+shift+t'"
        )
        self.token = token


class XDoorError(CorralError):
    """The X server refused or did not answer what the sandbox's init asked of it (corral.sandbox.display.xaccess):
    the init then does not start the browser."""


class InvalidMessage(CorralError, ValueError):
    """A control message an egress proxy refuses (corral.proxy.control); :meth:`reply` is the
    structured refusal it answers with."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field

    def reply(self) -> dict[str, Any]:  # typed by the control channel's messages (corral.proxy.control)
        out: dict[str, Any] = {"ok": False, "code": self.code, "error": str(self)}
        if self.field is not None:
            out["field"] = self.field
        return out


class SeedRefused(CorralError, ValueError):
    """A proxy's seed (corral.proxy.seed) that cannot be made or planted: too large, unreadable, or
    not what its manifest says."""


class ReplyTooLarge(CorralError, ValueError):
    """A controller answered more than the gateway's recorder may hold in one fetch."""


class DecodedTooLarge(CorralError, ValueError):
    """A body that decodes to more than the egress proxy reads for brokered secrets (a
    decompression bomb, or just too big to scan)."""


# -- requests the gateway refuses as written --------------------------------------------------------------


class InvalidRequest(CodedError, code=ErrorCode.INVALID_REQUEST):
    """A request that does not hold: a field out of range, a filter that does not parse."""


class InvalidCursor(InvalidRequest):
    """A position in a stream (``?after=``) that is no position."""


class MessageTooLarge(CodedError, code=ErrorCode.MESSAGE_TOO_LARGE):
    """A request body over its cap; refused unread."""


class UploadTooLarge(CodedError, code=ErrorCode.TOO_LARGE):
    """An upload over its cap (recorded responses)."""


class DownloadTooLarge(CodedError, code=ErrorCode.TOO_LARGE):
    """A download over ``CORRAL_MAX_DOWNLOAD_BYTES``: refused before its first byte when its size is
    known (a file's apparent size, a directory's by ``du``), else cut the moment it passes the cap."""


# -- who may do what --------------------------------------------------------------------------------------


class Unauthorized(CodedError, code=ErrorCode.UNAUTHORIZED):
    """No credential, or one that is no API key or session token."""


class Forbidden(CodedError, code=ErrorCode.FORBIDDEN):
    """A valid credential that does not open this: another key's session, another session's token."""


# -- what is not there ------------------------------------------------------------------------------------


class NotFound(CodedError, code=ErrorCode.NOT_FOUND):
    """No such thing for this caller (existence is never leaked to another key)."""


class SessionNotFound(NotFound):
    """No live session by that id (ended, timed out, deleted, or never made)."""


class TemplateNotFound(NotFound):
    """No template (or no such version of it) by that name: the ``template`` a session names, or one
    another key built (rebuilding or deleting it is its builder's alone)."""

    field: str | None = "template"


class ReplayNotFound(NotFound):
    """No such upload of recorded responses for this API key: the ``hermetic`` a session names."""

    field: str | None = "hermetic"


class VolumeNotFound(NotFound):
    """No workspace volume by that name for this API key (another key's is not told apart)."""

    field: str | None = "volume"


# -- the gateway's sessions -------------------------------------------------------------------------------


class PreviewGone(CodedError, code=ErrorCode.PREVIEW_GONE):
    """A preview's session ended (or was deleted): its previews ended with it."""


class NothingListening(CodedError, code=ErrorCode.NOTHING_LISTENING):
    """A preview's port has no server inside the sandbox (the controller's tunnel was refused)."""


class PreviewUnreachable(CodedError, code=ErrorCode.PREVIEW_UNREACHABLE):
    """The sandbox's controller did not open a preview's tunnel, or the server's answer was no HTTP."""


class PreviewBusy(CodedError, code=ErrorCode.TOO_MANY_CONNECTIONS):
    """A preview holds as many connections as ``CORRAL_PREVIEW_MAX_CONNECTIONS`` lets it."""


class HeadersTooLarge(CodedError, code=ErrorCode.HEADERS_TOO_LARGE):
    """A request's head (its line and headers) over the preview listener's cap."""


class DownloadNotFound(CodedError, code=ErrorCode.NO_SUCH_DOWNLOAD):
    """No download of the session by that id (a malformed id too), or its file is no longer there."""

    field: str | None = "download_id"


class DownloadUnavailable(CodedError, code=ErrorCode.DOWNLOAD_UNAVAILABLE):
    """A download with no whole file to give: still in progress, cancelled, capped, interrupted, or its
    file replaced by something the browser did not save (a link, another owner's file)."""

    field: str | None = "download_id"


class DownloadWaitTimedOut(CodedError, code=ErrorCode.TIMEOUT):
    """The SDK's ``downloads.wait``: no download that matches ended within its timeout."""


class ProfileNotFound(NotFound):
    """No saved browser profile of that name for this API key (another key's is none too)."""


class ProfilesOff(CodedError, code=ErrorCode.PROFILES_OFF):
    """The gateway has no CORRAL_PROFILE_KEY: no profile is loaded or saved."""


class ProfileTooLarge(CodedError, code=ErrorCode.TOO_LARGE):
    """A browser profile over CORRAL_PROFILE_MAX_MB: not saved, the previous version kept."""


class ProfileRefused(CodedError, code=ErrorCode.PROFILE_REFUSED):
    """A sandbox refused a profile's archive (a link, a path outside the profile, too many bytes) or
    could not export its browser's state; the reason, never a value."""


class ProfileUnreadable(CodedError, code=ErrorCode.PROFILE_UNREADABLE):
    """A saved profile that does not decrypt (another profile key, another key's or name's file, damage)."""


class CapacityError(CodedError, code=ErrorCode.TOO_MANY_SESSIONS):
    """Too many sessions, globally or for one key."""


class VolumeInUse(CodedError, code=ErrorCode.VOLUME_IN_USE):
    """A workspace volume held by another session (live, paused or being created): one at a time."""

    field: str | None = "volume"


class VolumeExists(CodedError, code=ErrorCode.VOLUME_EXISTS):
    """A workspace volume of that name exists for this API key already."""

    field: str | None = "name"


class TooManyVolumes(CodedError, code=ErrorCode.TOO_MANY_VOLUMES):
    """An API key at its count of workspace volumes (``CORRAL_MAX_VOLUMES_PER_KEY``)."""


class SessionPaused(CodedError, code=ErrorCode.SESSION_PAUSED):
    """The session is paused (or pausing, or resuming): it has no sandbox to act on until resumed."""


class SessionNotPaused(CodedError, code=ErrorCode.SESSION_NOT_PAUSED):
    """A resume of a session that is not paused, or a pause of one that is not running."""


class PausedCapacityError(CodedError, code=ErrorCode.TOO_MANY_PAUSED):
    """Too many paused sessions, globally or for one key (CORRAL_MAX_PAUSED, CORRAL_MAX_PAUSED_PER_KEY)."""


class SecretsMissing(CodedError, code=ErrorCode.SECRETS_MISSING):
    """A resume needs secret values the gateway no longer holds (held in memory only: a restart lost
    them); the message names them, and the resume body may give them again."""

    field: str | None = "secrets"


class HermeticUnavailable(CodedError, code=ErrorCode.EGRESS_OFF):
    """A hermetic replay was asked of a gateway without egress control."""

    field: str | None = "hermetic"


class EgressOff(CodedError, code=ErrorCode.EGRESS_OFF):
    """Brokered secrets were asked of a gateway without egress control (only its proxy can put them in)."""

    field: str | None = "secrets"


class ReplayUnreadable(CodedError, code=ErrorCode.REPLAY_UNREADABLE):
    """The hermetic session's proxy cannot answer from the uploaded responses."""

    field: str | None = "hermetic"


class AuditLogUnreadable(CodedError, code=ErrorCode.AUDIT_LOG_UNREADABLE):
    """A session's audit log holds a line that is not a record."""


class AuditAnchorsInvalid(CodedError, code=ErrorCode.AUDIT_ANCHORS_INVALID):
    """The gateway's anchors of an audit chain fail their MAC."""


class TicketKeyUnusable(CodedError, code=ErrorCode.INTERNAL):
    """The gateway's CDP ticket key (its data dir) cannot be read or holds no key."""


class KeyIdKeyUnusable(CodedError, code=ErrorCode.INTERNAL):
    """The gateway's key for API key ids (its data dir) cannot be read or holds no key."""


class WeakApiKey(CodedError, code=ErrorCode.INVALID_FIELD):
    """An API key given to the gateway (``CORRAL_API_KEY``) is too short or too guessable to hold."""


# -- the host side ----------------------------------------------------------------------------------------


class SandboxError(CodedError):
    """The host side could not build, start or reach a sandbox."""


class SandboxStartFailed(SandboxError, code=ErrorCode.SANDBOX_START_FAILED):
    """A session's sandbox (or its proxy) did not start or become ready, whatever the host side said."""


class UnprovenController(SandboxError, code=ErrorCode.CONTROLLER_UNPROVEN):
    """What answered on a sandbox's controller port could not prove the controller's per-boot secret:
    not one byte of its answer is believed (an impostor bound to the port, or a controller of another boot)."""


class NotOnThisRuntime(SandboxError, code=ErrorCode.NOT_ON_THIS_RUNTIME):
    """An operation the runtime driver does not offer (the swarm driver: workspace volumes, template
    builds, a browser state's export and import, pause); the message names the driver."""


class SandboxUnreachable(SandboxError, code=ErrorCode.SANDBOX_UNREACHABLE):
    """A sandbox's controller did not answer (refused, reset, timed out)."""


class EgressUnavailable(SandboxError, code=ErrorCode.EGRESS_UNAVAILABLE):
    """The session's proxy does not answer; its sandbox has no egress meanwhile."""


class GroundProxyLost(EgressUnavailable):
    """The proxy a ground started ahead does not answer at the start that took it (the start is made
    again without a ground: corral.gateway.sessions.starts; no caller sees this one)."""


class ImageBuildError(SandboxError, code=ErrorCode.IMAGE_BUILD_FAILED):
    """Building an image (or its Debian base) failed."""


class TemplateInvalid(CodedError, code=ErrorCode.TEMPLATE_INVALID):
    """A template's build context or file that cannot be read as one (the field or line to blame)."""


class TemplateBuildFailed(CodedError, code=ErrorCode.TEMPLATE_BUILD_FAILED):
    """A template's build failed at a step: the step and the end of its output; nothing of it was kept."""

    def __init__(self, message: str, step: str = "", output: str = "") -> None:
        super().__init__(message)
        self.step, self.output = step, output


class TemplateRefused(CodedError, code=ErrorCode.TEMPLATE_REFUSED):
    """A template that would weaken the sandbox (its boot, its controller, its users, a setuid binary,
    its entrypoint): refused with the reason, at build or at start."""

    field: str | None = "template"


class TemplateStale(CodedError, code=ErrorCode.TEMPLATE_STALE):
    """A template built on a base image that is no longer the gateway's: rebuild it."""

    field: str | None = "template"


# -- a session's files through the gateway (the controller's refusal, by its code) -----------------------


class FileRefused(CodedError, code=ErrorCode.FILE_FAILED):
    """A file upload or download the sandbox refused or failed (its code said nothing more precise)."""


class NoSuchFile(FileRefused, code=ErrorCode.NO_SUCH_FILE):
    """The path (or a directory on it) does not exist in the sandbox."""


class FileAccessDenied(FileRefused, code=ErrorCode.PERMISSION_DENIED):
    """The agent's uid may not read or write the path."""


class NotADirectory(FileRefused, code=ErrorCode.NOT_A_DIRECTORY):
    """A part of the path that must be a directory is a file."""


class IsADirectory(FileRefused, code=ErrorCode.IS_A_DIRECTORY):
    """An upload to a path that is a directory."""


class InvalidPath(FileRefused, code=ErrorCode.INVALID_FIELD):
    """A path the sandbox refuses as written (a NUL byte, not absolute, a bad mode)."""


class NoSpace(FileRefused, code=ErrorCode.NO_SPACE):
    """The sandbox's disk (the workspace, /tmp) is full: nothing was kept."""


class BundleError(CodedError, code=ErrorCode.BUNDLE_UNREADABLE):
    """Not a readable Corral recording: the message says why and where."""
