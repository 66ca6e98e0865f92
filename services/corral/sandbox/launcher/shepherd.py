"""The shepherd: one per process the agent runs, forked by the launcher, which forgets it.

It stays ``corral`` (real, effective and saved uid), so the agent can neither signal nor trace it,
and is the child subreaper of everything it starts: every orphan of the tree, ``setsid`` daemons
included, is re-parented to it, so "no child left" means "nothing of the tree is left". Its child
becomes the agent for good (no groups, no capabilities, its own session, nice +10, oom_score_adj
1000, killed if the shepherd dies), checks the working directory as the agent and execs. A spare
shepherd forks that child before its command comes (:func:`prepare`): a command waits for no fork.

Over its control channel it reports ``started``/``failed``, ``exited`` (the main process) and
``empty`` (the whole tree), and takes ``signal`` (to the main process's group) and ``kill_tree``.
When the controller's end closes, it kills the tree and exits.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import selectors
import signal
import socket
import termios
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from corral.sandbox.launcher import messages as m
from corral.sandbox.launcher.privileges import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    Ids,
    acting_as,
    become,
    prctl,
)

NICE = 10
OOM_SCORE_ADJ = 1000
MAX_KILL_ROUNDS = 10_000
_RESET_SIGNALS = (signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGXFSZ, signal.SIGHUP)


@dataclass(frozen=True, slots=True)
class Spawn:
    """What the agent's process is to be: argv, environment, working directory, stdio, a PTY or not."""

    argv: list[bytes]
    env: list[bytes]
    cwd: bytes
    stdio: tuple[int, int, int]
    pty: bool


def _parent_map() -> dict[int, list[int]]:
    """Live (not zombie) processes by parent pid, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                text = stat.read()
        except OSError:
            continue
        fields = text.rpartition(b")")[2].split()
        if len(fields) < 2 or fields[0] in (b"Z", b"X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, found by walking /proc's parent links."""
    children = _parent_map()
    found: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


@dataclass(frozen=True, slots=True)
class Ready:
    """A shepherd's child, forked ahead of its program (a spare shepherd forks it while it waits, so
    no fork is on a command's way): it takes its program and stdio on ``job``, then reports an exec
    failure on ``report`` (EOF once it exec'd)."""

    child: int
    job: socket.socket
    report: int
    wake: int  # the shepherd's SIGCHLD wake-up


def prepare(agent: Ids) -> Ready:
    """Become a shepherd (child subreaper, SIGCHLD wake-up) and fork the child; raises OSError."""
    shepherd = os.getpid()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        os.close(report_r)
        _child(theirs, report_w, shepherd, agent)
    theirs.close()
    os.close(report_w)
    return Ready(pid, ours, report_r, wake_r)


def _child(job: socket.socket, report: int, shepherd: int, agent: Ids) -> NoReturn:
    """The agent's side of the fork: what does not depend on the program first (while a spare
    waits), then the program's stdio, the agent's ids, its cwd, and exec."""
    stage, path = "setup", None
    try:
        _close_all_but(job.fileno(), report)  # the shepherd's own ends (the launcher's socket among them)
        signal.set_wakeup_fd(-1)
        for number in _RESET_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        os.setsid()
        os.nice(NICE)
        # The launcher turned undumpable when it last acted as the agent, which makes /proc/self
        # root's; as its own uid again, this child may own it back to set its OOM score.
        prctl(PR_SET_DUMPABLE, 1)
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as adj:
            adj.write(str(OOM_SCORE_ADJ))
        data, stdio, _, _ = socket.recv_fds(job, m.MAX_MESSAGE + 1, 3)
        if not data or len(stdio) != 3:
            os._exit(0)  # the shepherd is gone: nothing to run
        spawn = m.parse_job(data)
        high = [os.dup(fd) for fd in stdio]  # above 2, so the dup2s below cannot clobber
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        if spawn["pty"]:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        become(agent)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != shepherd:
            os._exit(137)
        _close_all_but(report)
        stage, path = "cwd", spawn["cwd"]
        os.chdir(spawn["cwd"])
        stage, path = "exec", spawn["argv"][0]
        env = dict(entry.split(b"=", 1) for entry in spawn["env"])
        os.execvpe(spawn["argv"][0], spawn["argv"], env)
    except (OSError, ValueError) as exc:
        code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
        failure = {"stage": stage, "errno": code, "path": None if path is None else m.b64(path)}
        with contextlib.suppress(OSError):
            os.write(report, json.dumps(failure).encode())
    finally:
        os._exit(127)


class Shepherd:
    def __init__(self, spawn: Spawn, control: socket.socket, agent: Ids, own: Ids) -> None:
        self.spawn = spawn
        self.control = control
        self.agent, self.own = agent, own
        self.main_pid = 0
        self.main_done = False
        self.main_status: int | None = None
        self.controller_gone = False

    def run(self, ready: Ready | None = None) -> NoReturn:
        """Start the program (in the child forked ahead, or one forked now), report, then watch."""
        fields = {"argv": self.spawn.argv, "env": self.spawn.env, "cwd": self.spawn.cwd, "pty": self.spawn.pty}
        try:
            ready = self._hand_over(ready, m.job(fields))
        except OSError as exc:
            # No room for one more process (the sandbox's pid limit, a fork bomb's aftermath).
            self._send(m.event("failed", stage="fork", errno=exc.errno or errno.EAGAIN, path=None))
            os._exit(0)
        self.main_pid = ready.child
        ready.job.close()
        for fd in set(self.spawn.stdio):
            os.close(fd)
        failure = _read_all(ready.report)
        if failure:
            os.waitpid(ready.child, 0)
            # The child wrote the event's fields (stage, errno, path) before it gave up.
            self._send(m.encode({"event": "failed", **json.loads(failure)}))
            os._exit(0)
        self._send(m.event("started", pid=ready.child))
        self._watch(ready.wake)

    def _hand_over(self, ready: Ready | None, job: bytes) -> Ready:
        """The program and its stdio to the child forked ahead; a fresh child if that one died while
        it waited (its OOM score makes it the OOM killer's first pick). Raises OSError."""
        if ready is not None:
            try:
                socket.send_fds(ready.job, [job], list(self.spawn.stdio))
                return ready
            except OSError:
                ready.job.close()
                os.close(ready.report)
                os.close(ready.wake)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(ready.child, 0)
        ready = prepare(self.agent)
        socket.send_fds(ready.job, [job], list(self.spawn.stdio))
        return ready

    def _watch(self, wake: int) -> NoReturn:
        selector = selectors.DefaultSelector()
        selector.register(wake, selectors.EVENT_READ)
        selector.register(self.control, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj == wake:
                    _drain(wake)
                elif not self.controller_gone:
                    self._order()
                    if self.controller_gone:
                        selector.unregister(self.control)
            if self._reap():
                self._send(m.event("empty"))
                os._exit(0)

    def _order(self) -> None:
        try:
            data = self.control.recv(m.MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:
            # The controller is gone: nobody can wait for or stop this tree any more.
            self.controller_gone = True
            self.kill_tree()
            return
        try:
            kind, number = m.parse_order(data)
        except ValueError:
            return
        if kind == "kill_tree":
            self.kill_tree()
        else:
            with acting_as(self.agent, self.own), contextlib.suppress(OSError):
                os.killpg(self.main_pid, number)

    def _reap(self) -> bool:
        """Collect exited children and report the main process's end (saying whether anything of
        its tree still runs); True once the tree is empty and that was reported."""
        empty = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                empty = True
                break
            if pid == 0:
                break
            if pid == self.main_pid:
                self.main_status = status
        if self.main_status is not None and not self.main_done:
            self.main_done = True
            status = self.main_status
            signalled = os.WIFSIGNALED(status)
            self._send(
                m.event(
                    "exited",
                    exit_code=None if signalled else os.waitstatus_to_exitcode(status),
                    signal=os.WTERMSIG(status) if signalled else None,
                    running=not empty,
                )
            )
        return empty and self.main_done

    def kill_tree(self) -> None:
        """SIGKILL every descendant, again and again until none is left alive (a fork bomb's children
        are found on the next round; a killed process forks no more)."""
        me = os.getpid()
        for _ in range(MAX_KILL_ROUNDS):
            alive = descendants(me)
            if not alive:
                return
            _kill_all(alive, self.agent, self.own)
            self._reap()

    def _send(self, data: bytes) -> None:
        if self.controller_gone:
            return
        try:
            self.control.send(data)
        except OSError:
            self.controller_gone = True


def _close_all_but(*keep: int) -> None:
    """Close every descriptor above 2 but ``keep``."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def _kill_all(pids: Iterable[int], agent: Ids, own: Ids) -> None:
    with acting_as(agent, own):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 512):
            pass
