"""The launcher's serving loop over a real socket, as the current user (agent and own ids the same):
no request, however big its answer or whatever bug it hits, ends the launcher."""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.sandbox.agent.launcher import LauncherClient, fsops
from corral.sandbox.agent.launcher import messages as m
from corral.sandbox.agent.launcher.privileges import Ids
from corral.sandbox.agent.launcher.server import Launcher

ME = Ids(os.getuid(), os.getgid())


@pytest.fixture
def launcher(tmp_path: Path) -> Launcher:
    return Launcher(tmp_path / "sock", ME, ME)


def ask(launcher: Launcher, op: str, **fields: Any) -> dict[str, Any]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        ours.send(m.encode(m.request(op, 7, **fields)))
        launcher._serve_one(theirs)
        return m.decode(ours.recv(m.MAX_MESSAGE + 1))


def many_files(directory: Path, count: int) -> None:
    for n in range(count):
        (directory / f"a-file-with-a-longish-name-{n:05}.txt").touch()


def test_a_directory_too_big_for_one_reply_answers_in_parts(launcher: Launcher, tmp_path: Path) -> None:
    many_files(tmp_path, 5000)
    reply = ask(launcher, "scandir", path=os.fsencode(tmp_path), limit=10_000, skip=0)
    assert reply["ok"] is True
    assert 0 < len(reply["entries"]) < 5000
    assert reply["next"] == len(reply["entries"])
    assert reply["truncated"] is False
    rest = ask(launcher, "scandir", path=os.fsencode(tmp_path), limit=10_000, skip=reply["next"])
    names = {e["path"] for e in reply["entries"]} | {e["path"] for e in rest["entries"]}
    assert len(names) == len(reply["entries"]) + len(rest["entries"])


def test_a_reply_too_big_for_the_wire_is_an_error_not_the_launchers_end(
    launcher: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(fsops.OPERATIONS, "stat", lambda f: ({"stat": "x" * (m.MAX_MESSAGE + 1)}, []))
    reply = ask(launcher, "stat", path=b"/", follow_symlinks=True)
    assert (reply["ok"], reply["errno"], reply["id"]) == (False, errno.EMSGSIZE, 7)


def test_a_request_that_hits_a_bug_is_answered_and_the_launcher_goes_on(
    launcher: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(f: Any) -> fsops.Outcome:
        raise RuntimeError("a bug")

    monkeypatch.setitem(fsops.OPERATIONS, "stat", broken)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        ours.send(m.encode(m.request("stat", 8, path=b"/", follow_symlinks=True)))
        with pytest.raises(RuntimeError):
            launcher._serve_one(theirs)
        reply = m.decode(ours.recv(m.MAX_MESSAGE + 1))
    assert (reply["ok"], reply["errno"], reply["id"]) == (False, errno.EIO, 8)
    with launcher._surviving("a test"):  # the loop's guard: logged, and the loop goes on
        raise RuntimeError("a bug")
    reply = ask(launcher, "unlink", path=b"/nonexistent-corral-test")
    assert (reply["ok"], reply["errno"]) == (False, errno.ENOENT)


@pytest.fixture
def serving(launcher: Launcher) -> Iterator[Launcher]:
    """The launcher's socket answered one connection at a time by a thread (serve() wants the main
    thread for its signal handling; _serve_one is the part under test)."""
    launcher.listen()
    launcher.listener.setblocking(True)
    stop = threading.Event()

    def run() -> None:
        conn, _ = launcher.listener.accept()
        with conn:
            while not stop.is_set():
                if not conn.recv(1, socket.MSG_PEEK):
                    return
                launcher._serve_one(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield launcher
    stop.set()
    thread.join(timeout=5)


async def test_the_client_lists_a_big_directory_whole(serving: Launcher, tmp_path: Path) -> None:
    listed = tmp_path / "big"
    listed.mkdir()
    many_files(listed, 5000)
    client = LauncherClient(serving.path)
    try:
        entries, truncated = await client.scandir(str(listed), 10_000)
        assert (len({e.name for e in entries}), truncated) == (5000, False)
        entries, truncated = await client.scandir(str(listed), 3000)
        assert (len(entries), truncated) == (3000, True)
    finally:
        await client.close()


def test_an_idle_spare_is_let_go_and_ends(launcher: Launcher) -> None:
    launcher.spare_idle_s = 30.0
    assert launcher._timeout() is None  # nothing to wait for: select sleeps until a request
    launcher._fork_spare()  # a real spare shepherd (and its child), forked from this process
    spare = launcher.spare
    assert spare is not None
    timeout = launcher._timeout()
    assert timeout is not None and 29.0 < timeout <= 30.0  # select wakes for the spare's idle end
    launcher._let_idle_spare_go()
    assert launcher.spare is spare  # a request came less than 30 s ago (the launcher's start)
    launcher.last_request -= 31.0
    assert launcher._timeout() == 0.0
    launcher._let_idle_spare_go()
    assert launcher.spare is None and launcher._timeout() is None
    assert spare.requests.fileno() == -1
    _, status = os.waitpid(spare.pid, 0)  # its socket closed, the shepherd ends of itself
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_request_keeps_the_spare(launcher: Launcher) -> None:
    launcher.spare_idle_s = 30.0
    launcher._fork_spare()
    spare = launcher.spare
    assert spare is not None
    launcher.last_request -= 31.0
    ask(launcher, "stat", path=b"/", follow_symlinks=True)  # any request counts
    launcher._let_idle_spare_go()
    assert launcher.spare is spare
    spare.requests.close()
    os.waitpid(spare.pid, 0)
