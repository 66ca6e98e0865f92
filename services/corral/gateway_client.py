"""The gateway's HTTP API from the client side: where the gateway is, the API key, and
:class:`Gateway` / :class:`AsyncGateway` (sessions, their egress, their actions over HTTP).

Every request is a :class:`Call` built by a pure function of :class:`calls`, which also says how its
answer is read; the two clients only send it, blocking or awaited. This is where the client side
(the SDK and the CLI) reads ``CORRAL_URL``, ``CORRAL_PORT`` and ``CORRAL_API_KEY``.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Generic, Self, TypeVar

import httpx

from corral.errors import CorralError, DownloadTooLarge, GatewayError
from corral.gateway_models import (
    BuiltTemplate,
    Preview,
    PreviewInfo,
    ProfileBody,
    ProfileInfo,
    RevokedPreview,
    SecretChange,
    SessionBody,
    SessionInfo,
    TemplateInfo,
    TrafficRecord,
    UploadedFile,
    VolumeInfo,
)
from corral.protocol.downloads import DownloadList

T = TypeVar("T")

DEFAULT_PORT = 8700
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
TIMEOUT_S = 120
CHUNK = 1 << 20  # what a file upload or download moves at a time


# -- where the gateway is, and the key ------------------------------------------------------------------


def gateway_url(url: str | None = None) -> str:
    """``url``, else ``$CORRAL_URL``, else 127.0.0.1 on ``$CORRAL_PORT`` (8700)."""
    return url or os.environ.get("CORRAL_URL") or f"http://127.0.0.1:{os.environ.get('CORRAL_PORT') or DEFAULT_PORT}"


def _data_dir_key() -> str | None:
    """The key a gateway on this host generated and kept (``$CORRAL_DATA_DIR/api_key``)."""
    data_dir = Path(os.environ.get("CORRAL_DATA_DIR") or Path.home() / ".local" / "share" / "corral")
    path = data_dir / "api_key"
    return path.read_text().strip() if path.is_file() else None


def api_key(stored: Callable[[], str | None] = _data_dir_key) -> str:
    """The first key of ``$CORRAL_API_KEY`` (comma-separated, as the gateway reads it), else the one
    ``stored`` finds (by default the data dir's; the CLI reads the compose gateway's)."""
    keys = [key.strip() for key in os.environ.get("CORRAL_API_KEY", "").split(",") if key.strip()]
    key = keys[0] if keys else stored()
    if not key:
        raise CorralError("no API key: set CORRAL_API_KEY (see `corral status`)")
    return key


# -- the gateway's HTTP API: requests and how their answers are read (pure) -----------------------------


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"error": {"code": "http_error", "message": response.text[:200]}}
        raise GatewayError(response.status_code, body)
    return response


def _json(response: httpx.Response) -> Any:
    return None if _checked(response).status_code == 204 else response.json()


def _nothing(response: httpx.Response) -> None:
    _checked(response)


def _ignored(response: httpx.Response) -> None:
    """A clean-up whose failure changes nothing for the caller."""


def _records(response: httpx.Response) -> list[TrafficRecord]:
    lines = _checked(response).text.splitlines()
    return [TrafficRecord.model_validate(json.loads(line)) for line in lines if line.strip()]


def _session(response: httpx.Response) -> SessionInfo:
    return SessionInfo.model_validate(_json(response))


def _sessions(response: httpx.Response) -> list[SessionInfo]:
    return [SessionInfo.model_validate(row) for row in _json(response)]


def _volume(response: httpx.Response) -> VolumeInfo:
    return VolumeInfo.model_validate(_json(response))


def _volumes(response: httpx.Response) -> list[VolumeInfo]:
    return [VolumeInfo.model_validate(row) for row in _json(response)]


def _profile(response: httpx.Response) -> ProfileInfo:
    return ProfileInfo.model_validate(_json(response))


def _profiles(response: httpx.Response) -> list[ProfileInfo]:
    return [ProfileInfo.model_validate(row) for row in _json(response)]


def _previews(response: httpx.Response) -> list[PreviewInfo]:
    """``{"previews": [...]}``: the session's previews, never their secrets."""
    return [PreviewInfo.model_validate(row) for row in _json(response)["previews"]]


def _downloads(response: httpx.Response) -> DownloadList:
    return DownloadList.model_validate(_json(response))


def downloads_path(session_id: str, download_id: str | None = None) -> str:
    """``/v1/sessions/{id}/downloads``, or one download's bytes under it."""
    path = f"/v1/sessions/{_segment(session_id)}/downloads"
    return path if download_id is None else f"{path}/{_segment(download_id)}"


def previews_path(session_id: str) -> str:
    return f"/v1/sessions/{_segment(session_id)}/previews"


def preview_body(port: int, ttl_s: int | None) -> dict[str, int]:
    """The body of a preview's create: the port, and its lifetime when given (the gateway's default
    is an hour, capped at the session's end)."""
    return {"port": port} | ({"ttl_s": ttl_s} if ttl_s is not None else {})


def _segment(name: str) -> str:
    """A name as one path segment (a '/' or '..' in it cannot reach another route)."""
    return urllib.parse.quote(name, safe="")


def _uploaded(response: httpx.Response) -> UploadedFile:
    return UploadedFile.model_validate(_json(response))


# A sandbox's reply relayed as it came: any message's (``ok`` true or false), read by whoever sent it.
def _reply(response: httpx.Response) -> dict[str, Any]:
    """A sandbox's reply relayed over HTTP (``ok`` true or false), or the gateway's own refusal."""
    try:
        reply = response.json()
    except ValueError:
        reply = None
    # A sandbox's reply always carries its request's ``id`` (null when the request had none); the
    # gateway's own error body has ``ok`` too but no ``id``.
    if isinstance(reply, dict) and "ok" in reply and "id" in reply:
        return reply
    _checked(response)  # the gateway's refusal (401, 404, 502, ...)
    message = f"the gateway's answer is no reply: {response.text[:200]}"
    raise GatewayError(response.status_code, {"error": {"code": "no_reply", "message": message}})


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request to the gateway's HTTP API and how its answer is read."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    json: object = None  # the request's body, JSON
    content: bytes | None = None
    params: dict[str, str] | None = None


def session_body(
    allow: Sequence[str] | None = None,
    viewport: tuple[int, int] | None = None,
    timeout_s: int | None = None,
    idle_timeout_s: int | None = None,
    labels: dict[str, str] | None = None,
    egress_mode: str | None = None,
    hermetic: str | None = None,
    secrets: Mapping[str, SecretChange] | None = None,
    env: Mapping[str, str] | None = None,
    volume: str | None = None,
    template: str | None = None,
    idle_action: str | None = None,
    *,
    profile: str | None = None,
    save_profile: bool = False,
) -> SessionBody:
    """The body of ``POST /v1/sessions``: what was given, nothing else (the gateway has the defaults).
    ``secrets``: name -> ``{"value", "allow", "in"?}`` (docs/gateway.md); ``env``: name -> value, in
    every command's environment (docs/environments.md); ``profile``: a saved browser profile to load
    (``save_profile``: saved at the session's end, made when missing)."""
    body: SessionBody = {"allow": list(allow or []), "labels": dict(labels or {})}
    if env:
        body["env"] = dict(env)
    if profile is not None:
        body["profile"] = ProfileBody(name=profile, save=save_profile)
    if secrets:
        body["secrets"] = {name: SecretChange(**spec) for name, spec in secrets.items()}
    if egress_mode is not None:
        body["egress_mode"] = egress_mode
    if hermetic is not None:
        body["hermetic"] = hermetic
    if template is not None:
        body["template"] = template
    if viewport is not None:
        body["viewport"] = {"width": viewport[0], "height": viewport[1]}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if idle_timeout_s is not None:
        body["idle_timeout_s"] = idle_timeout_s
    if volume is not None:
        body["volume"] = volume
    if idle_action is not None:
        body["idle_action"] = idle_action
    return body


def secret_change(
    value: str | None = None, allow: Sequence[str] | None = None, in_: Sequence[str] | None = None
) -> SecretChange:
    """One secret's entry in a PATCH's ``secrets``: what was given (a new secret needs value and
    allow; a rotation the value alone)."""
    change: SecretChange = {}
    if value is not None:
        change["value"] = value
    if allow is not None:
        change["allow"] = list(allow)
    if in_ is not None:
        change["in"] = list(in_)
    return change


def _placeholders(response: httpx.Response) -> dict[str, str]:
    return {str(name): str(placeholder) for name, placeholder in _json(response).items()}


def _missing_ok(response: httpx.Response) -> None:
    if response.status_code != 404:
        _checked(response)


class calls:  # a namespace of pure builders, read as calls.create_session(...)
    """Every request of the gateway's API, built without sending it."""

    @staticmethod
    def create_session(body: SessionBody) -> Call[SessionInfo]:
        return Call("POST", "/v1/sessions", _session, json=body)

    @staticmethod
    def session(session_id: str) -> Call[SessionInfo]:
        return Call("GET", f"/v1/sessions/{session_id}", _session)

    @staticmethod
    def sessions() -> Call[list[SessionInfo]]:
        return Call("GET", "/v1/sessions", _sessions)

    @staticmethod
    def update_session(session_id: str, allow: Sequence[str], egress_mode: str | None = None) -> Call[SessionInfo]:
        body: SessionBody = {"allow": list(allow)}
        if egress_mode is not None:
            body["egress_mode"] = egress_mode
        return Call("PATCH", f"/v1/sessions/{session_id}", _session, json=body)

    @staticmethod
    def update_secrets(session_id: str, changes: Mapping[str, SecretChange | None]) -> Call[SessionInfo]:
        """Add, change or (None) revoke secrets: the session as the gateway then shows it."""
        body = {"secrets": {name: None if change is None else dict(change) for name, change in changes.items()}}
        return Call("PATCH", f"/v1/sessions/{session_id}", _session, json=body)

    @staticmethod
    def set_timeout(session_id: str, timeout_s: int) -> Call[SessionInfo]:
        """The session now ends ``timeout_s`` from now (longer or shorter): the session with its new ``expires_at``."""
        return Call("PATCH", f"/v1/sessions/{session_id}", _session, json={"timeout_s": timeout_s})

    @staticmethod
    def secrets(session_id: str) -> Call[dict[str, str]]:
        return Call("GET", f"/v1/sessions/{session_id}/secrets", _placeholders)

    @staticmethod
    def delete_session(session_id: str, missing_ok: bool = False) -> Call[None]:
        return Call("DELETE", f"/v1/sessions/{session_id}", _missing_ok if missing_ok else _nothing)

    @staticmethod
    def pause_session(session_id: str) -> Call[SessionInfo]:
        return Call("POST", f"/v1/sessions/{session_id}/pause", _session)

    @staticmethod
    def resume_session(session_id: str, secrets: Mapping[str, str] | None = None) -> Call[SessionInfo]:
        """``secrets``: values a restarted gateway no longer holds (its 409 ``secrets_missing`` names them)."""
        return Call("POST", f"/v1/sessions/{session_id}/resume", _session, json={"secrets": dict(secrets or {})})

    @staticmethod
    def act(session_id: str, message: Mapping[str, Any]) -> Call[dict[str, Any]]:
        return Call("POST", f"/v1/sessions/{session_id}/actions", _reply, json=message)

    @staticmethod
    def traffic(session_id: str, filters: dict[str, str]) -> Call[list[TrafficRecord]]:
        return Call("GET", f"/v1/sessions/{session_id}/traffic", _records, params=filters)

    @staticmethod
    def upload_responses(data: bytes) -> Call[str]:
        return Call("POST", "/v1/replay-responses", lambda response: str(_json(response)["id"]), content=data)

    @staticmethod
    def delete_upload(upload_id: str) -> Call[None]:
        return Call("DELETE", f"/v1/replay-responses/{upload_id}", _ignored)

    @staticmethod
    def profiles() -> Call[list[ProfileInfo]]:
        return Call("GET", "/v1/profiles", _profiles)

    @staticmethod
    def profile(name: str) -> Call[ProfileInfo]:
        return Call("GET", f"/v1/profiles/{_segment(name)}", _profile)

    @staticmethod
    def delete_profile(name: str) -> Call[None]:
        return Call("DELETE", f"/v1/profiles/{_segment(name)}", _nothing)

    @staticmethod
    def save_profile(session_id: str) -> Call[ProfileInfo]:
        return Call("POST", f"/v1/sessions/{session_id}/profile/save", _profile)

    @staticmethod
    def create_preview(session_id: str, port: int, ttl_s: int | None = None) -> Call[Preview]:
        body = preview_body(port, ttl_s)
        return Call("POST", previews_path(session_id), lambda r: Preview.model_validate(_json(r)), json=body)

    @staticmethod
    def previews(session_id: str) -> Call[list[PreviewInfo]]:
        return Call("GET", previews_path(session_id), _previews)

    @staticmethod
    def revoke_preview(session_id: str, preview_id: str) -> Call[RevokedPreview]:
        path = f"{previews_path(session_id)}/{_segment(preview_id)}"
        return Call("DELETE", path, lambda r: RevokedPreview.model_validate(_json(r)))

    @staticmethod
    def downloads(session_id: str) -> Call[DownloadList]:
        return Call("GET", downloads_path(session_id), _downloads)

    @staticmethod
    def download_bytes(session_id: str, download_id: str) -> Call[bytes]:
        return Call("GET", downloads_path(session_id, download_id), lambda r: _checked(r).content)

    @staticmethod
    def get(path: str) -> Call[httpx.Response]:
        return Call("GET", path, _checked)

    @staticmethod
    def create_volume(name: str, size_mb: int | None = None) -> Call[VolumeInfo]:
        body: dict[str, object] = {"name": name} | ({"size_mb": size_mb} if size_mb is not None else {})
        return Call("POST", "/v1/volumes", _volume, json=body)

    @staticmethod
    def volumes() -> Call[list[VolumeInfo]]:
        return Call("GET", "/v1/volumes", _volumes)

    @staticmethod
    def volume(name: str) -> Call[VolumeInfo]:
        return Call("GET", f"/v1/volumes/{urllib.parse.quote(name, safe='')}", _volume)

    @staticmethod
    def delete_volume(name: str) -> Call[None]:
        return Call("DELETE", f"/v1/volumes/{urllib.parse.quote(name, safe='')}", _nothing)

    @staticmethod
    def templates() -> Call[list[TemplateInfo]]:
        return Call("GET", "/v1/templates", lambda r: [TemplateInfo.model_validate(t) for t in _json(r)])

    @staticmethod
    def template(name: str) -> Call[TemplateInfo]:
        return Call("GET", f"/v1/templates/{_quoted(name)}", lambda r: TemplateInfo.model_validate(_json(r)))

    @staticmethod
    def delete_template(name: str, version: int | None = None) -> Call[None]:
        params = {"version": str(version)} if version is not None else None
        return Call("DELETE", f"/v1/templates/{_quoted(name)}", _nothing, params=params)


# -- templates: a build's context sent, its NDJSON progress read to its last line --------------------------

MAX_BUILD_LINE = 1 << 20  # a line of a build's answer, at most (the gateway cuts its own far shorter)
Progress = Callable[[str], None]


def ignore_progress(line: str) -> None:
    """A build's progress, not wanted."""


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def build_params(name: str, file: str | None) -> dict[str, str]:
    return {"name": name, **({"file": file} if file is not None else {})}


def build_line(line: bytes, progress: Progress) -> BuiltTemplate | None:
    """One line of a build's answer: progress (handed on), the template (the end), or the error (raised)."""
    if len(line) > MAX_BUILD_LINE:
        raise GatewayError(502, {"error": {"code": "http_error", "message": "a build's answer line is too long"}})
    item = json.loads(line)
    if "progress" in item:
        progress(str(item["progress"]))
        return None
    if "template" in item:
        return BuiltTemplate.model_validate(item["template"])
    error = dict(item.get("error") or {"code": "http_error", "message": "the build's answer ended unread"})
    if error.get("step") or error.get("output"):
        error["message"] = f"{error.get('message')}\n--- {error.get('step')} ---\n{error.get('output', '')}"
    return _raise(error)


def _raise(error: dict[str, Any]) -> BuiltTemplate:
    raise GatewayError(422, {"error": error})


def _ended(built: BuiltTemplate | None) -> BuiltTemplate:
    if built is None:
        raise GatewayError(502, {"error": {"code": "http_error", "message": "the build's answer ended early"}})
    return built


# -- a session's files: streamed from and to local files, never held whole -------------------------------


@dataclass(frozen=True, slots=True)
class Download:
    """A downloaded file: where it was written, its size, and what it is (``application/x-tar`` for
    a directory, packed by the sandbox)."""

    path: Path
    size: int
    media_type: str

    @property
    def is_tar(self) -> bool:
        return self.media_type.split(";")[0].strip() == "application/x-tar"


def files_path(session_id: str) -> str:
    return f"/v1/sessions/{urllib.parse.quote(session_id, safe='')}/files"


def upload_params(remote: str, make_dirs: bool, mode: str | None) -> dict[str, str]:
    params = {"path": remote}
    if make_dirs:
        params["make_dirs"] = "1"
    if mode is not None:
        params["mode"] = mode
    return params


def _chunks(source: IO[bytes]) -> Iterator[bytes]:
    while chunk := source.read(CHUNK):
        yield chunk


async def _async_chunks(source: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(source.read, CHUNK):
        yield chunk


def _upload_headers(source: IO[bytes]) -> dict[str, str]:
    """Sized up front, so the gateway refuses a file over its cap before a byte is sent."""
    size = os.fstat(source.fileno()).st_size
    return {"content-type": "application/octet-stream", "content-length": str(size)}


def _part(local: Path) -> Path:
    """Where a download goes until it is complete (then renamed to ``local``): nothing half-written."""
    return local.with_name(f".{local.name}.part")


def _download_failed(response: httpx.Response, body: bytes) -> None:
    if response.status_code >= 400:
        _checked(httpx.Response(response.status_code, headers=response.headers, content=body))


class _Held:
    """A download's bytes read into memory up to ``max_bytes``: DownloadTooLarge past them."""

    def __init__(self, download_id: str, max_bytes: int) -> None:
        self.data = bytearray()
        self._id, self._max = download_id, max_bytes

    def add(self, chunk: bytes) -> None:
        if len(self.data) + len(chunk) > self._max:
            raise DownloadTooLarge(f"download {self._id} is over {self._max} bytes", "download_id")
        self.data += chunk


# The gateway names its download cap in this header; a stream cut once that many bytes came was cut for it.
MAX_DOWNLOAD_HEADER = "x-corral-max-download-bytes"
_CUT = (httpx.RemoteProtocolError, httpx.ReadError)


def _cut_for_cap(response: httpx.Response, received: int) -> GatewayError | None:
    """A download that broke off: ``too_large`` when it broke at the gateway's cap (it cuts a stream
    that passes it, having sent exactly the cap), else None (another failure, raised as it came)."""
    cap = response.headers.get(MAX_DOWNLOAD_HEADER, "")
    if not cap.isdigit() or received < int(cap):
        return None
    message = (
        f"the download passed the gateway's cap of {cap} bytes (CORRAL_MAX_DOWNLOAD_BYTES) and was cut; "
        "nothing was kept"
    )
    return GatewayError(413, {"error": {"code": "too_large", "message": message, "field": "path"}})


def _authorization(credential: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential or api_key()}"}


class Gateway:
    """The gateway's HTTP API, blocking. ``credential``: an API key (default :func:`api_key`) or a
    session's token (that session only); ``transport``: httpx's, for tests. Raises
    :class:`GatewayError` for a refusal."""

    def __init__(
        self, url: str | None = None, credential: str | None = None, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self._http = httpx.Client(
            base_url=gateway_url(url), timeout=TIMEOUT_S, headers=_authorization(credential), transport=transport
        )
        self.url = str(self._http.base_url).rstrip("/")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call[T]) -> T:
        return call.read(
            self._http.request(call.method, call.path, json=call.json, content=call.content, params=call.params)
        )

    def create_session(self, body: SessionBody) -> SessionInfo:
        return self.send(calls.create_session(body))

    def session(self, session_id: str) -> SessionInfo:
        return self.send(calls.session(session_id))

    def sessions(self) -> list[SessionInfo]:
        return self.send(calls.sessions())

    def update_session(self, session_id: str, allow: Sequence[str], egress_mode: str | None = None) -> SessionInfo:
        return self.send(calls.update_session(session_id, allow, egress_mode))

    def update_secrets(self, session_id: str, changes: Mapping[str, SecretChange | None]) -> SessionInfo:
        return self.send(calls.update_secrets(session_id, changes))

    def set_timeout(self, session_id: str, timeout_s: int) -> SessionInfo:
        return self.send(calls.set_timeout(session_id, timeout_s))

    def secrets(self, session_id: str) -> dict[str, str]:
        """The session's secrets' placeholders, by name (never a value)."""
        return self.send(calls.secrets(session_id))

    def delete_session(self, session_id: str, missing_ok: bool = False) -> None:
        self.send(calls.delete_session(session_id, missing_ok))

    def pause_session(self, session_id: str) -> SessionInfo:
        return self.send(calls.pause_session(session_id))

    def resume_session(self, session_id: str, secrets: Mapping[str, str] | None = None) -> SessionInfo:
        return self.send(calls.resume_session(session_id, secrets))

    def act(self, session_id: str, message: Mapping[str, Any]) -> dict[str, Any]:
        """One message through ``POST /v1/sessions/{id}/actions``: the sandbox's reply, ``ok`` or not."""
        return self.send(calls.act(session_id, message))

    def traffic(self, session_id: str, **filters: str) -> list[TrafficRecord]:
        return self.send(calls.traffic(session_id, filters))

    def upload_responses(self, data: bytes) -> str:
        return self.send(calls.upload_responses(data))

    def delete_upload(self, upload_id: str) -> None:
        self.send(calls.delete_upload(upload_id))

    def profiles(self) -> list[ProfileInfo]:
        """This API key's saved browser profiles (name, size, when saved)."""
        return self.send(calls.profiles())

    def profile(self, name: str) -> ProfileInfo:
        return self.send(calls.profile(name))

    def delete_profile(self, name: str) -> None:
        self.send(calls.delete_profile(name))

    def save_profile(self, session_id: str) -> ProfileInfo:
        """A live session's browser state saved now under the profile it was created with."""
        return self.send(calls.save_profile(session_id))

    def create_preview(self, session_id: str, port: int, ttl_s: int | None = None) -> Preview:
        """A preview of ``port`` inside the session (the owner's API key): its URL with the secret."""
        return self.send(calls.create_preview(session_id, port, ttl_s))

    def previews(self, session_id: str) -> list[PreviewInfo]:
        return self.send(calls.previews(session_id))

    def revoke_preview(self, session_id: str, preview_id: str) -> RevokedPreview:
        return self.send(calls.revoke_preview(session_id, preview_id))

    def get(self, path: str) -> httpx.Response:
        return self.send(calls.get(path))

    def downloads(self, session_id: str) -> DownloadList:
        """The session's browser downloads and their caps (docs/downloads.md)."""
        return self.send(calls.downloads(session_id))

    def download_bytes(self, session_id: str, download_id: str, max_bytes: int | None = None) -> bytes:
        """One download's bytes, read whole (at most the gateway's CORRAL_DOWNLOAD_MAX_FILE_MB); with
        ``max_bytes``, DownloadTooLarge the moment more come (a size listed before the read is no
        bound: the sandbox's download may be another by then), never more held."""
        if max_bytes is None:
            return self.send(calls.download_bytes(session_id, download_id))
        with self._http.stream("GET", downloads_path(session_id, download_id)) as response:
            _download_failed(response, response.read() if response.status_code >= 400 else b"")
            held = _Held(download_id, max_bytes)
            for chunk in response.iter_bytes(CHUNK):
                held.add(chunk)
        return bytes(held.data)

    def save_download(self, session_id: str, download_id: str, local: str | Path) -> Download:
        """One download's bytes streamed to ``local``, which appears only once it is complete."""
        target = Path(local)
        part = _part(target)
        try:
            size, content_type = self.download(downloads_path(session_id, download_id), part)
            part.replace(target)
        finally:
            part.unlink(missing_ok=True)
        return Download(target, size, content_type)

    def create_volume(self, name: str, size_mb: int | None = None) -> VolumeInfo:
        """A workspace volume of this key's, ``size_mb`` its quota (the gateway's default when None)."""
        return self.send(calls.create_volume(name, size_mb))

    def volumes(self) -> list[VolumeInfo]:
        return self.send(calls.volumes())

    def volume(self, name: str) -> VolumeInfo:
        return self.send(calls.volume(name))

    def delete_volume(self, name: str) -> None:
        """Deleted with what it holds; GatewayError 409 ``volume_in_use`` while a session holds it."""
        self.send(calls.delete_volume(name))

    def templates(self) -> list[TemplateInfo]:
        return self.send(calls.templates())

    def template(self, name: str) -> TemplateInfo:
        return self.send(calls.template(name))

    def delete_template(self, name: str, version: int | None = None) -> None:
        self.send(calls.delete_template(name, version))

    def build_template(
        self, name: str, context: bytes, file: str | None = None, progress: Progress = ignore_progress
    ) -> BuiltTemplate:
        """Build template ``name`` from ``context`` (a tar: :func:`corral.templatecontext.pack`), each
        progress line to ``progress``; the version made (or given back from the cache)."""
        headers = {"content-type": "application/x-tar"}
        params = build_params(name, file)
        timeout = httpx.Timeout(TIMEOUT_S, read=None)  # a build is as long as its packages take
        with self._http.stream(
            "POST", "/v1/templates", content=context, params=params, headers=headers, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                response.read()
                _checked(response)
            built: BuiltTemplate | None = None
            for line in response.iter_lines():
                if line.strip():
                    built = build_line(line.encode(), progress) or built
        return _ended(built)

    def upload_file(
        self, session_id: str, remote: str, local: str | Path, *, make_dirs: bool = False, mode: str | None = None
    ) -> UploadedFile:
        """``local`` written to ``remote`` in the session, streamed: its path, size and SHA-256."""
        with Path(local).open("rb") as source:
            response = self._http.put(
                files_path(session_id),
                params=upload_params(remote, make_dirs, mode),
                content=_chunks(source),
                headers=_upload_headers(source),
            )
        return _uploaded(response)

    def download(self, path: str, local: Path, params: dict[str, str] | None = None) -> tuple[int, str]:
        """GET ``path`` streamed into ``local`` (never held whole); returns its size and content type.
        GatewayError for a refusal."""
        with self._http.stream("GET", path, params=params) as response:
            _download_failed(response, response.read() if response.status_code >= 400 else b"")
            size = 0
            with local.open("wb") as out:
                try:
                    for chunk in response.iter_bytes(CHUNK):
                        size += out.write(chunk)
                except _CUT as exc:
                    raise _cut_for_cap(response, size) or exc from None
        return size, response.headers.get("content-type", "application/octet-stream")

    def download_file(self, session_id: str, remote: str, local: str | Path) -> Download:
        """``remote`` (a file's bytes, or a directory as a tar) streamed to ``local``, which appears
        only once it is complete."""
        target = Path(local)
        part = _part(target)
        try:
            size, content_type = self.download(files_path(session_id), part, {"path": remote})
            part.replace(target)
        finally:
            part.unlink(missing_ok=True)
        return Download(target, size, content_type)


class AsyncGateway:
    """The async twin of :class:`Gateway`."""

    def __init__(
        self,
        url: str | None = None,
        credential: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=gateway_url(url), timeout=TIMEOUT_S, headers=_authorization(credential), transport=transport
        )
        self.url = str(self._http.base_url).rstrip("/")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call[T]) -> T:
        return call.read(
            await self._http.request(call.method, call.path, json=call.json, content=call.content, params=call.params)
        )

    async def create_session(self, body: SessionBody) -> SessionInfo:
        return await self.send(calls.create_session(body))

    async def session(self, session_id: str) -> SessionInfo:
        return await self.send(calls.session(session_id))

    async def sessions(self) -> list[SessionInfo]:
        return await self.send(calls.sessions())

    async def update_session(
        self, session_id: str, allow: Sequence[str], egress_mode: str | None = None
    ) -> SessionInfo:
        return await self.send(calls.update_session(session_id, allow, egress_mode))

    async def update_secrets(self, session_id: str, changes: Mapping[str, SecretChange | None]) -> SessionInfo:
        return await self.send(calls.update_secrets(session_id, changes))

    async def set_timeout(self, session_id: str, timeout_s: int) -> SessionInfo:
        return await self.send(calls.set_timeout(session_id, timeout_s))

    async def secrets(self, session_id: str) -> dict[str, str]:
        return await self.send(calls.secrets(session_id))

    async def delete_session(self, session_id: str, missing_ok: bool = False) -> None:
        await self.send(calls.delete_session(session_id, missing_ok))

    async def pause_session(self, session_id: str) -> SessionInfo:
        return await self.send(calls.pause_session(session_id))

    async def resume_session(self, session_id: str, secrets: Mapping[str, str] | None = None) -> SessionInfo:
        return await self.send(calls.resume_session(session_id, secrets))

    async def act(self, session_id: str, message: Mapping[str, Any]) -> dict[str, Any]:
        return await self.send(calls.act(session_id, message))

    async def traffic(self, session_id: str, **filters: str) -> list[TrafficRecord]:
        return await self.send(calls.traffic(session_id, filters))

    async def upload_responses(self, data: bytes) -> str:
        return await self.send(calls.upload_responses(data))

    async def delete_upload(self, upload_id: str) -> None:
        await self.send(calls.delete_upload(upload_id))

    async def profiles(self) -> list[ProfileInfo]:
        """This API key's saved browser profiles (name, size, when saved)."""
        return await self.send(calls.profiles())

    async def profile(self, name: str) -> ProfileInfo:
        return await self.send(calls.profile(name))

    async def delete_profile(self, name: str) -> None:
        await self.send(calls.delete_profile(name))

    async def save_profile(self, session_id: str) -> ProfileInfo:
        """A live session's browser state saved now under the profile it was created with."""
        return await self.send(calls.save_profile(session_id))

    async def create_preview(self, session_id: str, port: int, ttl_s: int | None = None) -> Preview:
        """A preview of ``port`` inside the session (the owner's API key): its URL with the secret."""
        return await self.send(calls.create_preview(session_id, port, ttl_s))

    async def previews(self, session_id: str) -> list[PreviewInfo]:
        return await self.send(calls.previews(session_id))

    async def revoke_preview(self, session_id: str, preview_id: str) -> RevokedPreview:
        return await self.send(calls.revoke_preview(session_id, preview_id))

    async def get(self, path: str) -> httpx.Response:
        return await self.send(calls.get(path))

    async def create_volume(self, name: str, size_mb: int | None = None) -> VolumeInfo:
        return await self.send(calls.create_volume(name, size_mb))

    async def volumes(self) -> list[VolumeInfo]:
        return await self.send(calls.volumes())

    async def volume(self, name: str) -> VolumeInfo:
        return await self.send(calls.volume(name))

    async def delete_volume(self, name: str) -> None:
        await self.send(calls.delete_volume(name))

    async def templates(self) -> list[TemplateInfo]:
        return await self.send(calls.templates())

    async def template(self, name: str) -> TemplateInfo:
        return await self.send(calls.template(name))

    async def delete_template(self, name: str, version: int | None = None) -> None:
        await self.send(calls.delete_template(name, version))

    async def build_template(
        self, name: str, context: bytes, file: str | None = None, progress: Progress = ignore_progress
    ) -> BuiltTemplate:
        """As :meth:`Gateway.build_template`, awaited."""
        headers = {"content-type": "application/x-tar"}
        params = build_params(name, file)
        timeout = httpx.Timeout(TIMEOUT_S, read=None)
        async with self._http.stream(
            "POST", "/v1/templates", content=context, params=params, headers=headers, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                _checked(response)
            built: BuiltTemplate | None = None
            async for line in response.aiter_lines():
                if line.strip():
                    built = build_line(line.encode(), progress) or built
        return _ended(built)

    async def upload_file(
        self, session_id: str, remote: str, local: str | Path, *, make_dirs: bool = False, mode: str | None = None
    ) -> UploadedFile:
        with await asyncio.to_thread(Path(local).open, "rb") as source:
            response = await self._http.put(
                files_path(session_id),
                params=upload_params(remote, make_dirs, mode),
                content=_async_chunks(source),
                headers=_upload_headers(source),
            )
        return _uploaded(response)

    async def download(self, path: str, local: Path, params: dict[str, str] | None = None) -> tuple[int, str]:
        async with self._http.stream("GET", path, params=params) as response:
            _download_failed(response, await response.aread() if response.status_code >= 400 else b"")
            size = 0
            with await asyncio.to_thread(local.open, "wb") as out:
                try:
                    async for chunk in response.aiter_bytes(CHUNK):
                        size += await asyncio.to_thread(out.write, chunk)
                except _CUT as exc:
                    raise _cut_for_cap(response, size) or exc from None
        return size, response.headers.get("content-type", "application/octet-stream")

    async def downloads(self, session_id: str) -> DownloadList:
        return await self.send(calls.downloads(session_id))

    async def download_bytes(self, session_id: str, download_id: str, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            return await self.send(calls.download_bytes(session_id, download_id))
        async with self._http.stream("GET", downloads_path(session_id, download_id)) as response:
            _download_failed(response, await response.aread() if response.status_code >= 400 else b"")
            held = _Held(download_id, max_bytes)
            async for chunk in response.aiter_bytes(CHUNK):
                held.add(chunk)
        return bytes(held.data)

    async def save_download(self, session_id: str, download_id: str, local: str | Path) -> Download:
        target = Path(local)
        part = _part(target)
        try:
            size, content_type = await self.download(downloads_path(session_id, download_id), part)
            await asyncio.to_thread(part.replace, target)
        finally:
            part.unlink(missing_ok=True)
        return Download(target, size, content_type)

    async def download_file(self, session_id: str, remote: str, local: str | Path) -> Download:
        target = Path(local)
        part = _part(target)
        try:
            size, content_type = await self.download(files_path(session_id), part, {"path": remote})
            await asyncio.to_thread(part.replace, target)
        finally:
            part.unlink(missing_ok=True)
        return Download(target, size, content_type)
