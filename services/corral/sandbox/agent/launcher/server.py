"""The launcher: the one process that can act as the agent, for the controller alone.

Started (and restarted) by :mod:`corral.sandbox.startup.init` as ``corral`` with ambient CAP_SETUID and
CAP_SETGID only (bounding set the same two). Single-threaded: a ``selectors`` loop over its
listening socket, the controller's connections and its children's ends. It answers only peers whose
SO_PEERCRED uid is its own (the controller's), on a socket in a directory only that uid can enter.

``spawn`` hands the request to a shepherd (:mod:`corral.sandbox.agent.launcher.shepherd`) forked ahead
of need (a fresh one is forked after each answer) and answers at once; the shepherd reports on the
control channel the controller gave it. ``reserve`` forks a shepherd for the controller ahead of
need and hands back the controller's ends of its control channel and of its child's job socket: the
controller then starts a program with no launcher on the way (:func:`corral.sandbox.agent.launcher.shepherd.reserved`).
File operations run here with the
agent's effective ids, one request at a time; ``rmtree`` in a forked child that is the agent for
good, answered when it ends (or killed after :data:`RMTREE_TIMEOUT_S`). ``freeze`` and ``thaw`` likewise
run in a child that is the agent for good (:mod:`corral.sandbox.agent.launcher.sweep`); an agent process
may kill that child before it is stopped itself, so a sweep that ends without a result is forked
again until :data:`SWEEP_TIMEOUT_S`. The launcher keeps which processes the agent had stopped itself
before a freeze, and its thaw leaves them stopped.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import pwd
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple, NoReturn, TypedDict

from corral.sandbox.agent.launcher import fsops, sweep
from corral.sandbox.agent.launcher import messages as m
from corral.sandbox.agent.launcher.messages import SOCKET_PATH, SPARE_IDLE_S
from corral.sandbox.agent.launcher.privileges import Ids, become
from corral.sandbox.agent.launcher.shepherd import Ready, Shepherd, Spawn, batch_scheduling, prepare, reserved
from corral.sandbox.startup.stderrlog import StderrLog

# Not the logging module: corral.sandbox.startup.stderrlog says why.
log = StderrLog("corral.launcher")

AGENT_USER = "agent"
RMTREE_TIMEOUT_S = 120.0
# A freeze or thaw, its retries included (each sweep gives up after sweep.STOP_TIMEOUT_S itself).
SWEEP_TIMEOUT_S = sweep.STOP_TIMEOUT_S + 2.0
# Kept of the processes the agent had stopped itself (a sweep's result is one pipe write, well below
# the pipe's 64 KiB); past it, the rest are continued at the thaw like any other.
MAX_STOPPED_BEFORE = 1000


class _Removal(NamedTuple):
    """An ``rmtree``, ``freeze`` or ``thaw`` running in a child: whom to answer, by when it must be
    done, and which (a sweep that ends without a result is forked again)."""

    conn: socket.socket
    request_id: int
    pid: int
    deadline: float
    op: str = "rmtree"


class Frozen(TypedDict):
    """A freeze's outcome, as its child writes it to the launcher."""

    done: bool  # every agent process stopped
    rounds: int
    processes: int
    stopped_before: list[tuple[int, int]]  # (pid, start) of those the agent had stopped itself


class _Spare(NamedTuple):
    """A shepherd forked ahead, and our end of the socket its request will come on."""

    pid: int
    requests: socket.socket


def _hand_over(spare: _Spare, data: bytes, fds: tuple[int, ...]) -> bool:
    """The spawn request and its descriptors to the spare; False if it is gone (then we fork)."""
    try:
        socket.send_fds(spare.requests, [data], list(fds))
    except OSError as exc:
        log.warning("the spare shepherd %d is gone (%s)", spare.pid, exc)
        return False
    finally:
        spare.requests.close()
    return True


def _wait_for_request(requests: socket.socket, agent: Ids, own: Ids) -> NoReturn:
    """In a spare shepherd: its child forked ahead, one spawn request from the launcher, then the
    shepherd's life."""
    try:
        ready: Ready | None = prepare(agent)
    except OSError:
        ready = None  # no room now: tried again when the command comes, and reported if it fails
    try:
        data, fds, _, _ = socket.recv_fds(requests, m.MAX_MESSAGE + 1, m.MAX_FDS)
        requests.close()
        request = m.parse_request(data, fds) if data else None
    except (OSError, ValueError):
        request = None
    if request is None:
        os._exit(0)  # the launcher ended (or restarts): nothing to shepherd
    _shepherd(request, agent, own, ready)


def _shepherd(request: m.Request, agent: Ids, own: Ids, ready: Ready | None = None) -> NoReturn:
    stdin, stdout, stderr, control = request.fds
    fields = request.fields
    spawn = Spawn(fields["argv"], fields["env"], fields["cwd"], (stdin, stdout, stderr), fields["pty"])
    Shepherd(socket.socket(fileno=control), agent, own).run(spawn, ready)


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class Launcher:
    def __init__(self, path: str | os.PathLike[str], agent: Ids, own: Ids) -> None:
        self.path = os.fspath(path)
        self.agent, self.own = agent, own
        self.selector = selectors.DefaultSelector()
        self.removals: dict[int, _Removal] = {}  # by the read end of the child's result pipe
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.spare: _Spare | None = None
        self.spare_idle_s = SPARE_IDLE_S
        self.last_request = time.monotonic()
        self.pid = os.getpid()  # a forked child that comes back up here must never serve as the launcher
        # (pid, start) of the agent's processes it had stopped itself when the last freeze began.
        self.stopped_before: list[tuple[int, int]] = []
        self.frozen = False

    def listen(self) -> None:
        _bind_private(self.listener, self.path)
        self.listener.listen(16)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)

    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        self.selector.register(wake_r, selectors.EVENT_READ)
        log.info("launcher listening on %s (agent uid %d)", self.path, self.agent.uid)
        # Every shepherd is a fork of this process. What is here by now (the imports) is moved out of
        # the collector's sight, so a child's collection does not write to those pages and copy them:
        # they stay shared with the launcher (bench/gateway.py's idle session counts each copy).
        gc.freeze()
        batch_scheduling()
        self.fork_spare()
        while True:
            for key, _ in self.selector.select(self.timeout()):
                with self.surviving("serving the controller"):
                    self._ready(key, wake_r)
            with self.surviving("reaping children"):
                _reap()
                self._expire()
                self.let_idle_spare_go()

    def _ready(self, key: selectors.SelectorKey, wake_r: int) -> None:
        if key.fileobj is self.listener:
            self._accept()
        elif key.fileobj == wake_r:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        elif isinstance(key.fileobj, socket.socket):
            self.serve_one(key.fileobj)
        elif isinstance(key.fileobj, int):
            self._removed(key.fileobj)

    @contextlib.contextmanager
    def surviving(self, what: str) -> Iterator[None]:
        """No one request (nor a bug it hits) ends the launcher: every command and file operation
        of the sandbox goes through it. A forked child that raised its way back here just ends."""
        try:
            yield
        except Exception:
            if os.getpid() != self.pid:
                os._exit(1)
            log.exception("the launcher goes on after a failure while %s", what)

    def timeout(self) -> float | None:
        """How long the loop may sleep in select: until the next deadline (a child's, the spare's idle
        end), or None when nothing waits."""
        deadlines = [r.deadline for r in self.removals.values()]
        if self.spare is not None:
            deadlines.append(self.last_request + self.spare_idle_s)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def let_idle_spare_go(self) -> None:
        """The spare, once nothing was asked for ``spare_idle_s``: its socket closed, it and its child
        end (reaped as any child), and the next spawn forks on the way."""
        if self.spare is None or time.monotonic() - self.last_request < self.spare_idle_s:
            return
        spare, self.spare = self.spare, None
        spare.requests.close()
        log.info("idle for %.0f s: the spare shepherd %d is let go", self.spare_idle_s, spare.pid)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        if peer_uid(conn) != self.own.uid:
            log.warning("refused a connection from uid %d", peer_uid(conn))
            conn.close()
            return
        conn.setblocking(True)
        self.selector.register(conn, selectors.EVENT_READ)

    def serve_one(self, conn: socket.socket) -> None:
        self.last_request = time.monotonic()
        try:
            data, fds, flags, _ = socket.recv_fds(conn, m.MAX_MESSAGE + 1, m.MAX_FDS)
        except OSError:
            data, fds, flags = b"", [], 0
        if not data:
            self.selector.unregister(conn)
            conn.close()
            _close(fds)
            return
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ValueError("message or descriptors cut short")
            request = m.parse_request(data, fds)
        except ValueError as exc:
            _close(fds)
            self._reply(conn, m.refusal(_id_of(data), str(exc)), [])
            return
        try:
            self._dispatch(conn, request, data)
        except Exception:
            self._reply(conn, m.failure(request.id, errno.EIO), [])  # a bug on the way: still an answer
            raise

    def _dispatch(self, conn: socket.socket, request: m.Request, data: bytes) -> None:
        if request.op == "spawn":
            self._spawn(conn, request, data)
        elif request.op == "reserve":
            self._reserve(conn, request)
        elif request.op == "rmtree":
            self._rmtree(conn, request)
        elif request.op in ("freeze", "thaw"):
            self._sweep(conn, request.id, request.op, time.monotonic() + SWEEP_TIMEOUT_S)
        else:
            reply, out = fsops.run(request, self.agent, self.own)
            self._reply(conn, reply, out)

    def _reply(self, conn: socket.socket, reply: m.Reply, fds: list[int]) -> None:
        try:
            data = m.encode(reply)
        except ValueError as exc:  # too big for one message: the request fails, the launcher goes on
            log.error("a reply too big to send: %s", exc)
            _close(fds)
            fds = []
            request_id = reply.get("id")
            data = m.encode(m.failure(request_id if isinstance(request_id, int) else -1, errno.EMSGSIZE))
        try:
            socket.send_fds(conn, [data], fds) if fds else conn.send(data)
        except OSError as exc:
            log.info("could not answer the controller: %s", exc)
        finally:
            _close(fds)

    def _spawn(self, conn: socket.socket, request: m.Request, data: bytes) -> None:
        """Hand the request to the spare shepherd (forked ahead: no fork on the way), or fork one."""
        spare, self.spare = self.spare, None
        if spare is not None and _hand_over(spare, data, request.fds):
            pid = spare.pid
        else:
            try:
                pid = os.fork()
            except OSError as exc:
                _close(request.fds)
                self._reply(conn, m.failure(request.id, exc.errno or errno.EAGAIN), [])
                return
            if pid == 0:
                self._in_child(keep=set(request.fds))
                _shepherd(request, self.agent, self.own)
        _close(request.fds)
        self._reply(conn, m.ok(request.id, {"shepherd": pid}), [])
        self.fork_spare()  # after the reply: off the next command's way too

    def _reserve(self, conn: socket.socket, request: m.Request) -> None:
        """A shepherd forked for the controller alone: the controller gets our ends of its control
        channel and of its child's job socket (made here, before the fork, so that nothing but the
        shepherd, its child and the controller ever holds them)."""
        control, control_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        job, job_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError as exc:
            for sock in (control, control_theirs, job, job_theirs):
                sock.close()
            self._reply(conn, m.failure(request.id, exc.errno or errno.EAGAIN), [])
            return
        if pid == 0:
            self._in_child(keep={control_theirs.fileno(), job_theirs.fileno()})
            reserved(control_theirs, job_theirs, self.agent, self.own)
        control_theirs.close()
        job_theirs.close()
        self._reply(conn, m.ok(request.id, {"shepherd": pid}), [control.detach(), job.detach()])

    def fork_spare(self) -> None:
        """A shepherd forked ahead of need, waiting for its request on a socket only we hold."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError as exc:
            log.warning("no spare shepherd (%s): the next command forks its own", exc)
            ours.close()
            theirs.close()
            return
        if pid == 0:
            self._in_child(keep={theirs.fileno()})
            _wait_for_request(theirs, self.agent, self.own)
        theirs.close()
        self.spare = _Spare(pid, ours)

    def _in_child(self, keep: set[int]) -> None:
        """A forked child drops the launcher's sockets and its SIGCHLD wake-up."""
        signal.set_wakeup_fd(-1)
        self.selector.close()
        _close_all_but(keep)

    def _rmtree(self, conn: socket.socket, request: m.Request) -> None:
        path = request.fields["path"]
        deadline = time.monotonic() + RMTREE_TIMEOUT_S
        self._as_the_agent(conn, request.id, "rmtree", deadline, lambda: str(fsops.remove_tree(path)).encode())

    def _sweep(self, conn: socket.socket, request_id: int, op: str, deadline: float) -> None:
        """A freeze or thaw in a child that becomes the agent; answered from :meth:`_removed`."""
        uid, keep = self.agent.uid, self.stopped_before
        outcome: Callable[[], object] = (lambda: _freeze(uid)) if op == "freeze" else (lambda: _thaw(uid, keep))
        self._as_the_agent(conn, request_id, op, deadline, lambda: json.dumps(outcome()).encode())

    def _as_the_agent(
        self, conn: socket.socket, request_id: int, op: str, deadline: float, work: Callable[[], bytes]
    ) -> None:
        """``work`` in a forked child that becomes the agent for good (it may take long: the launcher
        stays free), its result written to a pipe that :meth:`_removed` reads and answers from."""
        result_r, result_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError as exc:
            _close([result_r, result_w])
            self._reply(conn, m.failure(request_id, exc.errno or errno.EAGAIN), [])
            return
        if pid == 0:
            try:
                self._in_child(keep={result_w})
                become(self.agent)
                os.write(result_w, work())
            finally:
                os._exit(0)
        os.close(result_w)
        self.removals[result_r] = _Removal(conn, request_id, pid, deadline, op)
        self.selector.register(result_r, selectors.EVENT_READ)

    def _swept(self, removal: _Removal, result: bytes, timed_out: bool) -> None:
        try:
            outcome = json.loads(result) if result else None
        except ValueError:
            outcome = None
        if not isinstance(outcome, dict):
            if not timed_out and time.monotonic() < removal.deadline:
                # Killed before it could say (an agent process is still free to signal it): again.
                log.warning("a %s sweep ended without a result; forking another", removal.op)
                self._sweep(removal.conn, removal.request_id, removal.op, removal.deadline)
                return
            reply = m.failure(removal.request_id, errno.ETIMEDOUT if timed_out else errno.EIO)
        elif removal.op == "freeze" and not outcome.get("done"):
            reply = m.failure(removal.request_id, errno.ETIMEDOUT)
        else:
            if removal.op == "freeze" and not self.frozen:
                # A second freeze finds every process stopped by the first: those are not the agent's.
                self.stopped_before = [(int(pid), int(start)) for pid, start in outcome.get("stopped_before", [])]
            self.frozen = removal.op == "freeze"
            if not self.frozen:
                self.stopped_before = []
            reply = m.ok(removal.request_id, _swept_fields(removal.op, outcome))
        if removal.conn.fileno() != -1:
            self._reply(removal.conn, reply, [])

    def _removed(self, fd: int, timed_out: bool = False) -> None:
        removal = self.removals.pop(fd)
        self.selector.unregister(fd)
        result = b"" if timed_out else os.read(fd, 64 * 1024)
        os.close(fd)
        if removal.op != "rmtree":
            self._swept(removal, result, timed_out)
            return
        code = int(result) if result.isdigit() else (errno.ETIMEDOUT if timed_out else errno.EIO)
        reply = m.ok(removal.request_id) if code == 0 else m.failure(removal.request_id, code)
        if removal.conn.fileno() != -1:
            self._reply(removal.conn, reply, [])

    def _expire(self) -> None:
        now = time.monotonic()
        for fd, removal in list(self.removals.items()):
            if removal.deadline <= now:
                with contextlib.suppress(OSError):
                    os.kill(removal.pid, signal.SIGKILL)
                self._removed(fd, timed_out=True)


def _freeze(agent_uid: int) -> Frozen:
    """In the sweep's child (the agent for good): every agent process stopped (the sweep's rounds)."""
    me = os.getpid()
    outcome = sweep.stop_all(lambda starts: sweep.scan(agent_uid, me, starts=starts), sweep.stop_every_agent_process)
    return Frozen(
        done=outcome.done,
        rounds=outcome.rounds,
        processes=outcome.processes,
        stopped_before=outcome.stopped_before[:MAX_STOPPED_BEFORE],
    )


def _thaw(agent_uid: int, keep: list[tuple[int, int]]) -> m.Reply:
    """In the sweep's child: every agent process continued but those it had stopped itself."""
    continued, left = sweep.continue_all(sweep.scan(agent_uid, os.getpid()), keep, os.kill)
    return m.Reply(continued=continued, left_stopped=left)


def _swept_fields(op: str, outcome: dict[str, int]) -> m.Reply:
    """The reply's fields of a sweep's outcome (its JSON, as :func:`_freeze` or :func:`_thaw` wrote
    it): all but the processes the agent had stopped itself, which the launcher keeps."""
    if op == "freeze":
        return m.Reply(done=bool(outcome["done"]), rounds=outcome["rounds"], processes=outcome["processes"])
    return m.Reply(continued=outcome["continued"], left_stopped=outcome["left_stopped"])


def _reap() -> None:
    # Shepherds and rmtree children: the launcher forgets them, but must not keep their zombies.
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _id_of(data: bytes) -> int | None:
    try:
        value = m.decode(data).get("id")
    except ValueError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _close(fds: list[int] | tuple[int, ...]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _open_fds() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/fd")]


def _close_all_but(keep: set[int]) -> None:
    """Every descriptor above stderr closed but ``keep`` (in a forked child)."""
    for fd in _open_fds():
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _bind_private(listener: socket.socket, path: str) -> None:
    """``listener`` bound at ``path`` (a stale socket there replaced), 0600 from its first moment."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)


def main() -> int:
    agent_entry = pwd.getpwnam(AGENT_USER)
    agent = Ids(agent_entry.pw_uid, agent_entry.pw_gid)
    own = Ids(os.getuid(), os.getgid())
    if own.uid == agent.uid or own.uid == 0:
        log.error("the launcher runs as the controller's uid, not %d", own.uid)
        return 3
    if os.getgroups():
        # What it opens as the agent must be the agent's doing alone: no group of anyone else's.
        log.error("the launcher holds supplementary groups %s; init starts it with none", os.getgroups())
        return 3
    launcher = Launcher(SOCKET_PATH, agent, own)
    try:
        launcher.listen()
    except OSError as exc:
        log.error("cannot listen on %s: %s", SOCKET_PATH, exc)
        return 3
    launcher.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
