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
from typing import Literal, NamedTuple, TypedDict, cast

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
DEFAULTS: dict[str, dict[str, int]] = {"scandir": {"skip": 0}}  # fields a request may leave out
FDS_IN: dict[str, int] = {"spawn": SPAWN_FDS}  # how many descriptors a request brings; none for the rest

SHEPHERD_ORDERS = ("signal", "kill_tree")
SHEPHERD_EVENTS = ("started", "failed", "exited", "empty")


# TypedDicts, not dataclasses: the launcher does not import dataclasses (nor pydantic), so every fork
# of it copies less; a TypedDict costs nothing at run time (typing is loaded anyway).


class Fields(TypedDict, total=False):
    """A request's fields, decoded (bytes from base64): each operation has those :data:`OPERATIONS`
    names, checked by :func:`parse_request` (so a handler reads its own without a check)."""

    argv: list[bytes]
    env: list[bytes]
    cwd: bytes
    pty: bool
    path: bytes
    flags: int
    mode: int
    follow_symlinks: bool
    limit: int
    skip: int
    parents: bool
    directory: bytes
    prefix: bytes
    source: bytes
    destination: bytes
    replace: bool


FileKind = Literal["file", "directory", "symlink", "other"]


class WireStat(TypedDict):
    """A stat result on the wire (``stat``'s, and each of ``scandir``'s entries)."""

    path: str  # base64 of the path's bytes
    type: FileKind
    size: int
    mode: int
    mtime: float
    target: str | None  # a symlink's target, base64


class Reply(TypedDict, total=False):
    """A reply: ``id`` and ``ok`` always; a failure's ``errno``, ``path`` (base64) and ``message``;
    an operation's own fields beside them (see the module's text)."""

    id: int | None  # None: a request that did not parse far enough to name its id
    ok: bool
    errno: int
    path: str | None  # a failure's path, or mkstemp's file (base64)
    message: str
    shepherd: int  # spawn, reserve: the shepherd's pid
    stat: WireStat
    entries: list[WireStat]  # scandir
    truncated: bool  # scandir: the limit cut the listing short
    next: int | None  # scandir: where the next message goes on (the reply's size cut it short)
    done: bool  # freeze: every agent process stopped
    rounds: int  # freeze
    processes: int  # freeze
    continued: int  # thaw
    left_stopped: int  # thaw: those the agent had stopped itself


class Request(NamedTuple):
    """A checked request: its id, operation and fields (bytes already decoded), and descriptors."""

    id: int
    op: str
    fields: Fields
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


def encode(message: Mapping[str, object]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"a launcher message is at most {MAX_MESSAGE} bytes; this one is {len(data)}")
    return data


def decode(data: bytes) -> dict[str, object]:
    """One message's object, its values unchecked (each parser checks those it reads); raises
    ValueError for anything else."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("a message is a JSON object")
    return obj


def request(op: str, request_id: int, **fields: object) -> dict[str, object]:
    """A request's object, bytes fields base64-encoded (the client's side of :func:`parse_request`)."""
    kinds = OPERATIONS[op]
    out: dict[str, object] = {"id": request_id, "op": op}
    for name, value in fields.items():
        out[name] = _wire(kinds[name], value)
    return out


def _wire(kind: str, value: object) -> object:
    if kind == "bytes" and isinstance(value, bytes):
        return b64(value)
    if kind == "bytes_list" and isinstance(value, list):
        return [b64(item) for item in value]
    return value


def _field(kind: str, name: str, value: object) -> object:
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
    fields = _fields(kinds, {name: obj[name] if name in obj else defaults[name] for name in kinds})
    if op == "spawn":
        _check_spawn(fields)
    if op == "scandir" and not 0 < fields["limit"] <= MAX_SCANDIR:
        raise ValueError(f"limit must be 1..{MAX_SCANDIR}")
    if op == "scandir" and fields["skip"] < 0:
        raise ValueError("skip is not negative")
    return Request(request_id, op, fields, tuple(fds))


def _fields(kinds: Mapping[str, str], given: Mapping[str, object]) -> Fields:
    """``given`` checked field by field against its ``kinds``."""
    checked = {name: _field(kind, name, given[name]) for name, kind in kinds.items()}
    # Every field named for the operation, each of its kind (_field raised otherwise): Fields' shape.
    return cast(Fields, checked)


def job(fields: Fields) -> bytes:
    """A spawn's fields (argv, env, cwd, pty), as a shepherd hands them to the child it forked ahead,
    or the controller to a reserved shepherd's child."""
    return encode(request("spawn", 0, argv=fields["argv"], env=fields["env"], cwd=fields["cwd"], pty=fields["pty"]))


def job_size(argv: list[bytes], env: list[bytes], cwd: bytes) -> int:
    """The length of :func:`job`'s message for these fields (a terminal or not: ``false`` is the longer),
    counted rather than encoded: base64 text needs no JSON escape, so each value is its quotes and
    ``4 * ceil(n / 3)`` characters. What a command's check of its size costs (once per ``exec``)."""

    def listed(values: list[bytes]) -> int:
        return sum(_b64_size(len(value)) + 2 for value in values) + max(0, len(values) - 1)

    fixed = len('{"id":0,"op":"spawn","argv":[],"env":[],"cwd":"","pty":false}')
    return fixed + listed(argv) + listed(env) + _b64_size(len(cwd))


# The most digits a launcher request's id has beyond job()'s "0": a connection's count of its calls
# (corral.sandbox.agent.launcher.connection), which no sandbox takes past 2**63.
_REQUEST_ID_ROOM = len(str(2**63)) - 1


def spawn_size(argv: list[bytes], env: list[bytes], cwd: bytes) -> int:
    """The most bytes a command of these fields takes on either way it goes: :func:`job` to a spare
    shepherd, or the launcher's own ``spawn`` request (no spare ready), whose id is its connection's
    next, not 0. What a command's size is checked against, so that both ways take what it admits."""
    return job_size(argv, env, cwd) + _REQUEST_ID_ROOM


def _b64_size(length: int) -> int:
    return 4 * ((length + 2) // 3)


def parse_job(data: bytes) -> Fields:
    """The child's side of :func:`job`: checked here too, since a reserved shepherd's child takes it
    from the controller directly. Raises ValueError."""
    obj = decode(data)
    fields = _fields(OPERATIONS["spawn"], {name: obj.get(name) for name in OPERATIONS["spawn"]})
    _check_spawn(fields)
    return fields


def _check_spawn(fields: Fields) -> None:
    if not fields["argv"]:
        raise ValueError("argv is empty")
    for item in [*fields["argv"], *fields["env"], fields["cwd"]]:
        if b"\0" in item:
            raise ValueError("argv, env and cwd hold no NUL byte")
    if any(b"=" not in entry for entry in fields["env"]):
        raise ValueError("an env entry is NAME=value")


def ok(request_id: int, fields: Reply | None = None) -> Reply:
    """A success, with the operation's own ``fields`` after ``id`` and ``ok``."""
    reply = Reply(id=request_id, ok=True)
    reply.update(fields or {})
    return reply


def failure(request_id: int, errno: int, path: bytes | None = None) -> Reply:
    """An operation's OSError, as the client turns back into OSError(errno, strerror, path)."""
    return Reply(id=request_id, ok=False, errno=errno, path=None if path is None else b64(path))


def refusal(request_id: int | None, message: str) -> Reply:
    """A request that did not parse: a bug on the controller's side, not the agent's doing."""
    return Reply(id=request_id, ok=False, errno=errno.EINVAL, path=None, message=message)


def parse_reply(data: bytes) -> Reply:
    """The client's side of a reply; raises ValueError when it is no JSON object. Its fields are
    read as the launcher wrote them: the launcher is this image's own code, as trusted as the
    controller, so its replies are not checked field by field (a request is: it may come from a
    controller's bug)."""
    return cast(Reply, decode(data))


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
    ints = {name: _int_or_none(obj.get(name), name) for name in ("pid", "exit_code", "signal", "errno")}
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


def _int_or_none(value: object, name: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{name} must be an integer")
    return value


def event(kind: str, **fields: int | str | bytes | bool | None) -> bytes:
    """A shepherd's event (see :class:`ShepherdEvent`), its ``path`` base64-encoded."""
    path = fields.get("path")
    if isinstance(path, bytes):
        fields["path"] = b64(path)
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
