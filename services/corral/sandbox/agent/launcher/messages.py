"""The launcher's wire: one JSON object per ``SOCK_SEQPACKET`` message, file descriptors beside it
(SCM_RIGHTS). Pure: encoding, decoding and checking, no I/O.

Paths, argv and environment entries are bytes on the wire (base64 in the JSON), so names that are
not UTF-8 go through unchanged. Every request carries an ``id`` its reply repeats.

Requests (controller → launcher): ``spawn`` (argv, env, cwd; fds: stdin, stdout, stderr and the
shepherd's end of the control channel), ``reserve`` (a shepherd forked ahead for the controller
alone; fds back: the controller's end of its control channel, then of its child's job socket, on
which the controller later sends :func:`job` and the stdio itself), ``openpty`` (fds back: master,
slave), and the file
operations done as the agent (``open``, ``stat``, ``scandir``, ``mkdir``, ``mkstemp``, ``rename``,
``chmod``, ``unlink``, ``rmdir``, ``rmtree``), and ``freeze`` / ``thaw`` (every agent process stopped
or continued: :mod:`corral.sandbox.agent.launcher.sweep`). Replies: ``{"id", "ok": true, ...}`` or
``{"id", "ok": false, "errno", "path"}``.

The control channel (controller ⇄ one shepherd) carries events the other way: ``started {pid}``,
``failed {stage, errno, path}``, ``exited {exit_code, signal, running}``, ``empty`` (no process of the tree
is left); and the controller's orders ``signal {signal}`` and ``kill_tree``.
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
from collections.abc import Mapping
from typing import Any, NamedTuple

# Strings, not pathlib's paths: the launcher does not import pathlib (corral.sandbox.startup.stderrlog says why).
SOCKET_DIR = "/run/corral/launcher"  # 0700, the controller's uid (made by boot)
SOCKET_PATH = f"{SOCKET_DIR}/sock"
# Spares (a shepherd and its child forked ahead, two copies of the launcher, about 9 MiB of an idle
# sandbox's memory) are let go after this long without a command, the controller's reserved ones and
# the launcher's own alike, as the Playwright driver is: the next command forks on the way, a few ms
# slower (bench/spares.py), and spares are made again after it.
SPARE_IDLE_S = 45.0

MAX_MESSAGE = 160 * 1024  # below the default socket send buffer (about 208 KiB): one datagram, whole
MAX_FDS = 4
MAX_SCANDIR = 100_000
# The JSON of one scandir reply's entries stops short of this; the rest is asked for again from
# ``next`` (a directory of any size, one message at a time, each well below MAX_MESSAGE).
SCANDIR_REPLY_BYTES = 96 * 1024

SPAWN_FDS = 4  # stdin, stdout, stderr, control
JOB_FDS = 3  # stdin, stdout, stderr: beside a job on a reserved shepherd's job socket
RESERVE_FDS = 2  # back with a reserve's reply: the control channel's end, the job socket's end

# Each operation's fields and their kinds: "bytes" (base64 on the wire), "bytes_list", "int", "bool".
OPERATIONS: dict[str, dict[str, str]] = {
    "spawn": {"argv": "bytes_list", "env": "bytes_list", "cwd": "bytes", "pty": "bool"},
    "reserve": {},
    "openpty": {},
    "open": {"path": "bytes", "flags": "int", "mode": "int"},
    "stat": {"path": "bytes", "follow_symlinks": "bool"},
    "scandir": {"path": "bytes", "limit": "int", "skip": "int"},
    "mkdir": {"path": "bytes", "mode": "int", "parents": "bool"},
    "mkstemp": {"directory": "bytes", "prefix": "bytes"},
    "rename": {"source": "bytes", "destination": "bytes", "replace": "bool"},
    "chmod": {"path": "bytes", "mode": "int"},
    "unlink": {"path": "bytes"},
    "rmdir": {"path": "bytes"},
    "rmtree": {"path": "bytes"},
    # Every process of the agent's uid stopped (a human holds the lease) or continued again
    # (corral.sandbox.agent.launcher.sweep): answered once done.
    "freeze": {},
    "thaw": {},
}
DEFAULTS: dict[str, dict[str, Any]] = {"scandir": {"skip": 0}}  # fields a request may leave out
FDS_IN: dict[str, int] = {"spawn": SPAWN_FDS}  # how many descriptors a request brings; none for the rest

SHEPHERD_ORDERS = ("signal", "kill_tree")
SHEPHERD_EVENTS = ("started", "failed", "exited", "empty")


class Request(NamedTuple):
    """A checked request: its id, operation and fields (bytes already decoded), and descriptors."""

    id: int
    op: str
    fields: Mapping[str, Any]
    fds: tuple[int, ...] = ()


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def unb64(value: object, name: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError(f"{name} is not base64") from None


def encode(message: Mapping[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"a launcher message is at most {MAX_MESSAGE} bytes; this one is {len(data)}")
    return data


def decode(data: bytes) -> dict[str, Any]:
    """One message's object; raises ValueError for anything else."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("a message is a JSON object")
    return obj


def request(op: str, request_id: int, **fields: Any) -> dict[str, Any]:
    """A request's object, bytes fields base64-encoded (the client's side of :func:`parse_request`)."""
    kinds = OPERATIONS[op]
    out: dict[str, Any] = {"id": request_id, "op": op}
    for name, value in fields.items():
        kind = kinds[name]
        if kind == "bytes":
            out[name] = b64(value)
        elif kind == "bytes_list":
            out[name] = [b64(item) for item in value]
        else:
            out[name] = value
    return out


def _field(kind: str, name: str, value: object) -> Any:
    if kind == "bytes":
        return unb64(value, name)
    if kind == "bytes_list":
        if not isinstance(value, list):
            raise ValueError(f"{name} must be a list")
        return [unb64(item, name) for item in value]
    if kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer")
        return value
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


def parse_request(data: bytes, fds: list[int]) -> Request:
    """The launcher's check of one request; raises ValueError (the caller closes ``fds``)."""
    obj = decode(data)
    request_id, op = obj.get("id"), obj.get("op")
    if not isinstance(request_id, int) or isinstance(request_id, bool):
        raise ValueError("id must be an integer")
    if not isinstance(op, str) or op not in OPERATIONS:
        raise ValueError(f"unknown operation {op!r}")
    kinds = OPERATIONS[op]
    unknown = set(obj) - set(kinds) - {"id", "op"}
    if unknown:
        raise ValueError(f"{op}: unknown fields {sorted(unknown)}")
    defaults = DEFAULTS.get(op, {})
    missing = set(kinds) - set(obj) - set(defaults)
    if missing:
        raise ValueError(f"{op}: missing fields {sorted(missing)}")
    if len(fds) != FDS_IN.get(op, 0):
        raise ValueError(f"{op} brings {FDS_IN.get(op, 0)} descriptors, not {len(fds)}")
    fields = {name: _field(kind, name, obj[name] if name in obj else defaults[name]) for name, kind in kinds.items()}
    if op == "spawn":
        _check_spawn(fields)
    if op == "scandir" and not 0 < fields["limit"] <= MAX_SCANDIR:
        raise ValueError(f"limit must be 1..{MAX_SCANDIR}")
    if op == "scandir" and fields["skip"] < 0:
        raise ValueError("skip is not negative")
    return Request(request_id, op, fields, tuple(fds))


def job(fields: Mapping[str, Any]) -> bytes:
    """A spawn's fields (argv, env, cwd, pty), as a shepherd hands them to the child it forked ahead,
    or the controller to a reserved shepherd's child."""
    obj = request("spawn", 0, **{name: fields[name] for name in OPERATIONS["spawn"]})
    return encode(obj)


def parse_job(data: bytes) -> dict[str, Any]:
    """The child's side of :func:`job`: checked here too, since a reserved shepherd's child takes it
    from the controller directly. Raises ValueError."""
    obj = decode(data)
    fields = {name: _field(kind, name, obj.get(name)) for name, kind in OPERATIONS["spawn"].items()}
    _check_spawn(fields)
    return fields


def _check_spawn(fields: Mapping[str, Any]) -> None:
    if not fields["argv"]:
        raise ValueError("argv is empty")
    for item in [*fields["argv"], *fields["env"], fields["cwd"]]:
        if b"\0" in item:
            raise ValueError("argv, env and cwd hold no NUL byte")
    if any(b"=" not in entry for entry in fields["env"]):
        raise ValueError("an env entry is NAME=value")


def ok(request_id: int, **fields: Any) -> dict[str, Any]:
    return {"id": request_id, "ok": True, **fields}


def failure(request_id: int, errno: int, path: bytes | None = None) -> dict[str, Any]:
    """An operation's OSError, as the client turns back into OSError(errno, strerror, path)."""
    return {"id": request_id, "ok": False, "errno": errno, "path": None if path is None else b64(path)}


def refusal(request_id: int | None, message: str) -> dict[str, Any]:
    """A request that did not parse: a bug on the controller's side, not the agent's doing."""
    return {"id": request_id, "ok": False, "errno": errno.EINVAL, "path": None, "message": message}


class ShepherdEvent(NamedTuple):
    """One event from a shepherd (see the module's text)."""

    kind: str
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    stage: str | None = None
    errno: int | None = None
    path: bytes | None = None
    running: bool = True  # exited: whether anything of the tree still runs


def parse_event(data: bytes) -> ShepherdEvent:
    obj = decode(data)
    kind = obj.get("event")
    if kind not in SHEPHERD_EVENTS:
        raise ValueError(f"unknown shepherd event {kind!r}")
    ints = {name: obj.get(name) for name in ("pid", "exit_code", "signal", "errno")}
    for name, value in ints.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{name} must be an integer")
    stage = obj.get("stage")
    if stage is not None and not isinstance(stage, str):
        raise ValueError("stage must be text")
    path = obj.get("path")
    running = obj.get("running", True)
    if not isinstance(running, bool):
        raise ValueError("running must be true or false")
    return ShepherdEvent(
        str(kind),
        pid=ints["pid"],
        exit_code=ints["exit_code"],
        signal=ints["signal"],
        stage=stage,
        errno=ints["errno"],
        path=None if path is None else unb64(path, "path"),
        running=running,
    )


def event(kind: str, **fields: Any) -> bytes:
    if "path" in fields and fields["path"] is not None:
        fields["path"] = b64(fields["path"])
    return encode({"event": kind, **fields})


def parse_order(data: bytes) -> tuple[str, int]:
    """A controller's order to a shepherd: (``signal``, number) or (``kill_tree``, 9)."""
    obj = decode(data)
    op = obj.get("op")
    if op == "kill_tree":
        return "kill_tree", 9
    number = obj.get("signal")
    if op == "signal" and isinstance(number, int) and not isinstance(number, bool) and 0 < number < 65:
        return "signal", number
    raise ValueError(f"not an order a shepherd takes: {obj!r}")


def order(kind: str, number: int = 9) -> bytes:
    return encode({"op": kind, "signal": number} if kind == "signal" else {"op": kind})
