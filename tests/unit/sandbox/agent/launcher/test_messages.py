"""The launcher's wire, pure: what the controller sends is what the launcher reads, and what the
launcher refuses."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from corral.sandbox.agent.launcher import messages as m


def wire(op: str, **fields: Any) -> bytes:
    return m.encode(m.request(op, 7, **fields))


def test_a_spawn_request_round_trips_bytes_that_are_not_utf8() -> None:
    argv = [b"printf", b"\xff\xfe", b"a b"]
    data = wire("spawn", argv=argv, env=[b"A=1", b"B=\xff"], cwd=b"/w\xff", pty=False)
    request = m.parse_request(data, [3, 4, 5, 6])
    assert (request.id, request.op, request.fds) == (7, "spawn", (3, 4, 5, 6))
    assert request.fields == {"argv": argv, "env": [b"A=1", b"B=\xff"], "cwd": b"/w\xff", "pty": False}


def test_file_requests_carry_their_fields() -> None:
    request = m.parse_request(wire("rename", source=b"/a", destination=b"/b", replace=False), [])
    assert request.fields == {"source": b"/a", "destination": b"/b", "replace": False}
    request = m.parse_request(wire("open", path=b"/x", flags=0, mode=0o644), [])
    assert request.fields["mode"] == 0o644


@pytest.mark.parametrize(
    ("obj", "fds", "reason"),
    [
        ({"id": 1, "op": "format_disk"}, [], "unknown operation"),
        ({"id": "1", "op": "unlink", "path": "eA=="}, [], "id must be an integer"),
        ({"id": True, "op": "unlink", "path": "eA=="}, [], "id must be an integer"),
        ({"id": 1, "op": "unlink"}, [], "missing fields"),
        ({"id": 1, "op": "unlink", "path": "eA==", "extra": 1}, [], "unknown fields"),
        ({"id": 1, "op": "unlink", "path": "not base64!"}, [], "not base64"),
        ({"id": 1, "op": "unlink", "path": 5}, [], "base64 text"),
        ({"id": 1, "op": "open", "path": "eA==", "flags": True, "mode": 1}, [], "integer"),
        ({"id": 1, "op": "stat", "path": "eA==", "follow_symlinks": 1}, [], "true or false"),
        ({"id": 1, "op": "unlink", "path": "eA=="}, [3], "descriptors"),
        ({"id": 1, "op": "scandir", "path": "eA==", "limit": 0}, [], "limit"),
    ],
)
def test_the_launcher_refuses_what_does_not_hold(obj: dict[str, Any], fds: list[int], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        m.parse_request(json.dumps(obj).encode(), fds)


@pytest.mark.parametrize(
    ("argv", "env", "cwd", "reason"),
    [
        ([], [], b"/", "argv is empty"),
        ([b"a\0b"], [], b"/", "NUL"),
        ([b"a"], [b"A=\0"], b"/", "NUL"),
        ([b"a"], [], b"/\0", "NUL"),
        ([b"a"], [b"NOVALUE"], b"/", "NAME=value"),
    ],
)
def test_a_spawn_is_refused_before_any_fork(argv: list[bytes], env: list[bytes], cwd: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        m.parse_request(wire("spawn", argv=argv, env=env, cwd=cwd, pty=False), [3, 4, 5, 6])


def test_not_json_and_not_objects_are_refused() -> None:
    for data in (b"\xff", b"[1]", b"{"):
        with pytest.raises(ValueError):
            m.decode(data)


def test_a_message_never_exceeds_one_datagram() -> None:
    with pytest.raises(ValueError, match="at most"):
        m.encode({"blob": "x" * m.MAX_MESSAGE})


def test_replies_say_errno_and_path() -> None:
    assert m.failure(3, 2, b"/x") == {"id": 3, "ok": False, "errno": 2, "path": "L3g="}
    assert m.ok(3, {"pid": 9}) == {"id": 3, "ok": True, "pid": 9}
    assert m.refusal(None, "bad")["errno"] == 22


def test_shepherd_events_and_orders() -> None:
    exited = m.parse_event(m.event("exited", exit_code=None, signal=9, running=False))
    assert (exited.kind, exited.exit_code, exited.signal, exited.running) == ("exited", None, 9, False)
    failed = m.parse_event(m.event("failed", stage="cwd", errno=2, path=b"/no\xff"))
    assert (failed.stage, failed.errno, failed.path) == ("cwd", 2, b"/no\xff")
    assert m.parse_event(m.event("started", pid=42)).pid == 42
    with pytest.raises(ValueError, match="unknown shepherd event"):
        m.parse_event(b'{"event": "hijack"}')
    with pytest.raises(ValueError, match="pid"):
        m.parse_event(b'{"event": "started", "pid": "1"}')
    assert m.parse_order(m.order("kill_tree")) == ("kill_tree", 9)
    assert m.parse_order(m.order("signal", 15)) == ("signal", 15)
    for bad in (b'{"op": "signal", "signal": 0}', b'{"op": "signal", "signal": true}', b'{"op": "exec"}'):
        with pytest.raises(ValueError):
            m.parse_order(bad)


def test_a_shepherd_hands_its_child_the_spawn_it_was_given() -> None:
    fields = {"argv": [b"ls", b"\xff"], "env": [b"A=1"], "cwd": b"/w", "pty": True}
    assert m.parse_job(m.job(fields)) == fields
    with pytest.raises(ValueError, match="NUL"):
        m.parse_job(m.job({**fields, "cwd": b"/\0"}))


def test_a_reserve_brings_no_fields_and_no_descriptors() -> None:
    request = m.parse_request(wire("reserve"), [])
    assert (request.id, request.op, request.fields, request.fds) == (7, "reserve", {}, ())
    with pytest.raises(ValueError, match="reserve brings 0 descriptors"):
        m.parse_request(wire("reserve"), [3])
    with pytest.raises(ValueError, match="unknown fields"):
        m.parse_request(json.dumps({"id": 1, "op": "reserve", "argv": []}).encode(), [])
    assert (m.RESERVE_FDS, m.JOB_FDS) == (2, 3)  # back: control, job; with a job: stdin, stdout, stderr


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ({"argv": [], "env": [], "cwd": "Lw==", "pty": False}, "argv is empty"),
        ({"argv": ["bHM="], "env": ["QQ=="], "cwd": "Lw==", "pty": False}, "NAME=value"),
        ({"argv": ["bHM="], "env": [], "pty": False}, "cwd must be base64"),
        ({"argv": ["bHM="], "env": [], "cwd": "Lw==", "pty": 1}, "pty must be true or false"),
    ],
)
def test_a_reserved_child_checks_the_job_the_controller_sends_it(obj: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        m.parse_job(json.dumps(obj).encode())


@pytest.mark.parametrize(
    ("argv", "env", "cwd"),
    [
        ([b"true"], [], b"/"),
        ([b"sh", b"-c", b"echo \xff\"'\\\n"], [b"A=1", b"B=" + bytes(range(256)), b"C="], b"/workspace/d\xc3\xa9j\xe0"),
        ([b"x" * n for n in range(7)], [b"E" * n for n in range(1, 8)], b""),
    ],
)
def test_a_jobs_size_is_counted_as_it_would_be_encoded(argv: list[bytes], env: list[bytes], cwd: bytes) -> None:
    fields: m.Fields = {"argv": argv, "env": env, "cwd": cwd, "pty": False}
    assert m.job_size(argv, env, cwd) == len(m.job(fields))


def _longest_padding(size: Callable[[list[bytes], list[bytes], bytes], int], argv: list[bytes], cwd: bytes) -> int:
    """The longest value of an env entry ``P=...`` that ``size`` counts within MAX_MESSAGE."""
    low, high = 0, m.MAX_MESSAGE
    while low < high:
        middle = (low + high + 1) // 2
        if size(argv, [b"P=" + b"x" * middle], cwd) <= m.MAX_MESSAGE:
            low = middle
        else:
            high = middle - 1
    return low


def test_what_a_commands_size_check_admits_fits_the_launchers_request_whatever_its_id() -> None:
    # With no spare shepherd the controller sends a command to the launcher itself, as a request
    # with its connection's next id (one more for every call of the sandbox's life), not job()'s 0:
    # what the check admits must fit there too, or the agent hears a ValueError, not the field.
    argv, cwd = [b"true"], b"/"
    env = [b"P=" + b"x" * _longest_padding(m.spawn_size, argv, cwd)]
    assert m.spawn_size(argv, env, cwd) > m.MAX_MESSAGE - 4  # the largest the check admits
    m.job({"argv": argv, "env": env, "cwd": cwd, "pty": False})
    for request_id in (1, 12_345, 10**12, 2**63 - 1):
        m.encode(m.request("spawn", request_id, argv=argv, env=env, cwd=cwd, pty=False))
    # job()'s own length, what the check counted before, admits a message the launcher's way refuses.
    longest = [b"P=" + b"x" * _longest_padding(m.job_size, argv, cwd)]
    with pytest.raises(ValueError, match="at most"):
        m.encode(m.request("spawn", 12_345, argv=argv, env=longest, cwd=cwd, pty=False))
