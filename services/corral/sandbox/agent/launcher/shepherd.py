"""The shepherd: one per process the agent runs, forked by the launcher, which forgets it.

It stays ``corral`` (real, effective and saved uid), so the agent can neither signal nor trace it,
and is the child subreaper of everything it starts: every orphan of the tree, ``setsid`` daemons
included, is re-parented to it, so "no child left" means "nothing of the tree is left". Its child
becomes the agent for good (no groups, no capabilities, its own session, nice +10, oom_score_adj
1000, killed if the shepherd dies), checks the working directory as the agent and execs. A spare
shepherd forks that child before its command comes (:func:`prepare`): a command waits for no fork.
A reserved shepherd (:func:`reserved`, the launcher's ``reserve``) goes one step further: its child
takes the job straight from the controller on a socket the launcher handed the controller, so
neither the launcher nor the shepherd is on a command's way; the shepherd only watches the child's
report pipe (EOF at exec) and reports as ever.

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
from typing import NamedTuple, NoReturn

from corral.sandbox.agent.launcher import messages as m
from corral.sandbox.agent.launcher.privileges import (
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


def batch_scheduling() -> None:
    """The launcher and what it forks (shepherds, a command's child until its exec) run SCHED_BATCH:
    the same share of the CPU as before, but a wake-up of theirs never preempts the task that woke
    them. The controller wakes the launcher (a ``reserve``) and a spare's child (a job) with a
    message and goes on to its reply; as SCHED_OTHER, each woke on the controller's CPU and took it
    at once, so a fork sat on every reply's way (docs/design/0450). Best effort: the policy is
    about latency, nothing depends on it."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def normal_scheduling() -> None:
    """The agent's program runs SCHED_OTHER at :data:`NICE`, as any process of the sandbox would
    (a process may leave SCHED_BATCH for SCHED_OTHER without a privilege)."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


class Spawn(NamedTuple):
    """What the agent's process is to be: argv, environment, working directory, stdio, a PTY or not."""

    argv: list[bytes]
    env: list[bytes]
    cwd: bytes
    stdio: tuple[int, int, int]
    pty: bool


def _process_table() -> dict[int, tuple[int, int]]:
    """Live (not zombie) processes: pid to (parent pid, process group), from /proc."""
    table: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                text = stat.read()
        except OSError:
            continue
        fields = text.rpartition(b")")[2].split()
        if len(fields) < 3 or fields[0] in (b"Z", b"X"):
            continue
        table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def descendants(root: int, group: int | None = None) -> list[int]:
    """Every live process below ``root`` (those of process group ``group`` only, if given), found
    by walking /proc's parent links."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if group is None or table[pid][1] == group:
            found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


class Ready(NamedTuple):
    """A shepherd's child, forked ahead of its program (a spare shepherd forks it while it waits, so
    no fork is on a command's way): it takes its program and stdio on ``job``, then reports an exec
    failure on ``report`` (EOF once it exec'd)."""

    child: int
    job: socket.socket | None  # None in a reserved shepherd: the controller holds the other end
    report: int
    wake: int  # the shepherd's SIGCHLD wake-up


def prepare(agent: Ids, job: socket.socket | None = None) -> Ready:
    """Become a shepherd (child subreaper, SIGCHLD wake-up) and fork the child, which takes its job
    on ``job`` if given (closed here after the fork: the child holds the only end), else on a
    socket to this shepherd; raises OSError."""
    shepherd = os.getpid()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if job is None else (None, job)
    pid = os.fork()
    if pid == 0:
        if ours is not None:
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
        # The launcher turned undumpable when it last acted as the agent, which makes /proc/self
        # root's; as its own uid again, this child may own it back to set its OOM score.
        prctl(PR_SET_DUMPABLE, 1)
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as adj:
            adj.write(str(OOM_SCORE_ADJ))
        data, stdio, flags, _ = socket.recv_fds(job, m.MAX_MESSAGE + 1, m.JOB_FDS)
        if not data:
            # Nobody will send a job (the shepherd is gone, or the controller dropped this spare):
            # say so, so that the shepherd never takes this end for an exec.
            raise OSError(errno.EPIPE, "no job came")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(stdio) != m.JOB_FDS:
            raise ValueError("a job is one whole message with stdin, stdout and stderr")
        spawn = m.parse_job(data)
        high = [os.dup(fd) for fd in stdio]  # above 2, so the dup2s below cannot clobber
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        if spawn["pty"]:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        # Lowered here, not while the spare waits: its wake-up and the job's reading are the
        # launcher's code on a command's way, and at nice 10 a loaded machine gives them a tenth of
        # a core. Still before become: nothing of the agent's ever runs above nice 10.
        os.nice(NICE)
        become(agent)
        normal_scheduling()
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


def reserved(control: socket.socket, job: socket.socket, agent: Ids, own: Ids) -> NoReturn:
    """A reserved shepherd's life: its child forked at once, on ``job`` (whose other end the controller
    holds), then the child's start reported on ``control``. A spare the controller drops (both ends
    closed) ends: the child sees no job and gives up, the shepherd sees the controller gone."""
    shepherd = Shepherd(control, agent, own)
    try:
        ready = prepare(agent, job)
    except OSError as exc:
        job.close()
        shepherd.send(m.event("failed", stage="fork", errno=exc.errno or errno.EAGAIN, path=None))
        os._exit(0)
    shepherd.run_reserved(ready)


class Shepherd:
    def __init__(self, control: socket.socket, agent: Ids, own: Ids) -> None:
        self.control = control
        self.agent, self.own = agent, own
        self.main_pid = 0
        self.main_done = False
        self.main_status: int | None = None
        self.controller_gone = False

    def run(self, spawn: Spawn, ready: Ready | None = None) -> NoReturn:
        """Start the program (in the child forked ahead, or one forked now), report, then watch."""
        fields: m.Fields = {"argv": spawn.argv, "env": spawn.env, "cwd": spawn.cwd, "pty": spawn.pty}
        try:
            ready = self._hand_over(ready, m.job(fields), spawn.stdio)
        except OSError as exc:
            # No room for one more process (the sandbox's pid limit, a fork bomb's aftermath).
            self.send(m.event("failed", stage="fork", errno=exc.errno or errno.EAGAIN, path=None))
            os._exit(0)
        self.main_pid = ready.child
        for fd in set(spawn.stdio):
            os.close(fd)
        self._report_start(ready)

    def run_reserved(self, ready: Ready) -> NoReturn:
        """The controller sends the job to the child itself: wait for the child's report (or for the
        controller to drop this spare), report, then watch."""
        self.main_pid = ready.child
        selector = selectors.DefaultSelector()
        selector.register(ready.report, selectors.EVENT_READ)
        selector.register(self.control, selectors.EVENT_READ)
        while not any(key.fileobj == ready.report for key, _ in selector.select()):
            self._order()
            if self.controller_gone:
                os._exit(0)  # _order killed the child (still ours: never given a job) on the way
        selector.close()
        self._report_start(ready)

    def _report_start(self, ready: Ready) -> NoReturn:
        failure = _read_all(ready.report)
        if failure:
            os.waitpid(ready.child, 0)
            # The child wrote the event's fields (stage, errno, path) before it gave up.
            self.send(m.encode({"event": "failed", **json.loads(failure)}))
            os._exit(0)
        self.send(m.event("started", pid=ready.child))
        self._watch(ready.wake)

    def _hand_over(self, ready: Ready | None, job: bytes, stdio: tuple[int, int, int]) -> Ready:
        """The program and its stdio to the child forked ahead; a fresh child if that one died while
        it waited (its OOM score makes it the OOM killer's first pick). Raises OSError."""
        if ready is not None and ready.job is not None:
            try:
                socket.send_fds(ready.job, [job], list(stdio))
                return ready
            except OSError:
                os.close(ready.report)
                os.close(ready.wake)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(ready.child, 0)
            finally:
                ready.job.close()
        ready = prepare(self.agent)
        assert ready.job is not None  # prepare made the socket: no job end was given
        try:
            socket.send_fds(ready.job, [job], list(stdio))
        finally:
            ready.job.close()
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
                self.send(m.event("empty"))
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
            # To the main process's group, as found below us: not killpg, which would reach whatever
            # group took that number once the group was gone (the kill is as the agent by the effective
            # uid only; our real uid, corral, lets a signal reach corral's processes too).
            _kill_all(descendants(os.getpid(), group=self.main_pid), self.agent, self.own, number)

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
            self.send(
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

    def send(self, data: bytes) -> None:
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


def _kill_all(pids: Iterable[int], agent: Ids, own: Ids, number: int = signal.SIGKILL) -> None:
    with acting_as(agent, own):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, number)


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
