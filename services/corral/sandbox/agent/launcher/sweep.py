"""Stopping every process of the agent's uid and continuing them again (a human's turn: the lease).

Runs in a child the launcher forks, which has become the agent for good
(:func:`~corral.sandbox.agent.launcher.privileges.become`): ``kill(-1, SIGSTOP)`` then reaches every
process whose real or saved uid is the agent's, setsid and double-forked daemons included, and
nothing else (the controller, the launcher, shepherds and Xvfb keep ``corral`` as their real and
saved uid). SIGSTOP, not SIGTSTP: it cannot be caught, blocked or ignored. The cgroup freezer would
do it in one write, but the sandbox's cgroups are read-only, and giving the container a writable one
is more than this needs (docs/design/0265-freezing-the-agent.md).

A stop is done when two scans of /proc in a row find every thread of every agent process stopped
(``T``, or ``t`` under a tracer that is itself the agent's) and find the same threads with the same
context-switch counts: a thread that ran in between (continued by an agent process the first scan
had not reached yet, which then stopped itself) switched at least once, so equal counts mean every
one of them was stopped at the moment between the two scans, and nothing stopped can continue
anything. A process forked during a round is stopped by the next.

Processes the agent had stopped itself before the stop (all threads ``T``) are reported, and the
launcher leaves them stopped at the thaw.

The scan's parsing is pure (:func:`parse_status`, :func:`stable`); the loops take the kernel calls as
arguments so they are tested without signals.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

# A stop that has not held after this long fails (a process stuck in uninterruptible sleep, say).
STOP_TIMEOUT_S = 5.0
# Between rounds, the time a process continued or forked mid-round needs to show up.
ROUND_PAUSE_S = 0.001
STOPPED = frozenset("Tt")
DEAD = frozenset("ZX")


class Thread(NamedTuple):
    tid: int
    state: str
    switches: int  # voluntary + involuntary context switches


class Process(NamedTuple):
    """An agent process as one scan saw it: its start (against pid reuse) and its threads."""

    pid: int
    start: int
    threads: tuple[Thread, ...]

    @property
    def stopped(self) -> bool:
        return all(t.state in STOPPED or t.state in DEAD for t in self.threads)

    @property
    def stopped_by_itself(self) -> bool:
        """Stopped (not traced) with every live thread: as the agent's own ``kill -STOP`` leaves it."""
        live = [t for t in self.threads if t.state not in DEAD]
        return bool(live) and all(t.state == "T" for t in live)


Snapshot = dict[int, Process]
Identity = tuple[int, int]  # (pid, start)


class Status(NamedTuple):
    state: str
    uids: tuple[int, ...]  # real, effective, saved, filesystem
    switches: int
    threads: int = 1


def parse_status(text: str) -> Status | None:
    """The fields of a /proc/<pid>/status (or task/<tid>/status) we need; None if it lacks them."""
    state, switches, found, threads = "", 0, 0, 1
    uids: tuple[int, ...] = ()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "State":
            state = value.strip()[:1]
            found += 1
        elif name == "Uid":
            uids = tuple(int(part) for part in value.split())
            found += 1
        elif name in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            switches += int(value.strip())
            found += 1
        elif name == "Threads":
            threads = int(value.strip())
    return Status(state, uids, switches, threads) if found == 4 and len(uids) >= 3 else None


def parse_start(stat: str) -> int:
    """The start time (clock ticks after boot) in a /proc/<pid>/stat line: field 22, counted after
    the command's closing parenthesis (a name may hold spaces and parentheses)."""
    return int(stat.rpartition(")")[2].split()[19])


def is_agents(uids: tuple[int, ...], agent_uid: int) -> bool:
    """Whether a process with these ids is one ``kill`` as the agent reaches: real or saved uid."""
    return uids[0] == agent_uid or uids[2] == agent_uid


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None  # gone meanwhile


def scan(agent_uid: int, me: int, *, starts: bool = True) -> Snapshot:
    """Every live process of the agent's uid but ``me``, with its threads; without ``starts`` (a stop
    round's scans) no start time is read (0): nothing of the agent's forks between two of those
    without a thread of it running, which the switch counts show."""
    found: Snapshot = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        process = _process(int(name), agent_uid, starts)
        if process is not None:
            found[process.pid] = process
    return found


def _process(pid: int, agent_uid: int, starts: bool) -> Process | None:
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return None
    leader = parse_status(status)
    if leader is None or not is_agents(leader.uids, agent_uid) or (leader.state in DEAD and _no_threads(pid)):
        return None
    start = 0
    if starts:
        stat = _read(f"/proc/{pid}/stat")
        if stat is None:
            return None
        start = parse_start(stat)
    if leader.threads == 1:  # the common case: the process's own status is its one thread's
        return Process(pid, start, (Thread(pid, leader.state, leader.switches),))
    threads: list[Thread] = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            text = _read(f"/proc/{pid}/task/{name}/status")
            parsed = parse_status(text) if text is not None else None
            if parsed is not None:
                threads.append(Thread(int(name), parsed.state, parsed.switches))
    if not threads:
        return None
    return Process(pid, start, tuple(threads))


def _no_threads(pid: int) -> bool:
    try:
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except OSError:
        return True


def stable(before: Snapshot, after: Snapshot) -> bool:
    """Whether two scans in a row prove every agent process stopped at once (the module's text)."""
    return all(p.stopped for p in before.values()) and before == after


class Outcome(NamedTuple):
    done: bool
    rounds: int
    processes: int
    stopped_before: list[Identity]


def stop_all(
    scanner: Callable[[bool], Snapshot],
    stop: Callable[[], None],
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
    timeout_s: float = STOP_TIMEOUT_S,
) -> Outcome:
    """Stop rounds (``stop``: the kill) until two scans agree that all are stopped, or ``timeout_s``.
    ``scanner(starts)``: the first scan reads start times (for the processes stopped before), the
    rounds' do not."""
    first = scanner(True)
    stopped_before = [(p.pid, p.start) for p in first.values() if p.stopped_by_itself]
    deadline = clock() + timeout_s
    rounds = 0
    while True:
        rounds += 1
        stop()
        before = scanner(False)
        if all(p.stopped for p in before.values()):
            after = scanner(False)
            if stable(before, after):
                return Outcome(True, rounds, len(after), stopped_before)
        if clock() >= deadline:
            return Outcome(False, rounds, len(before), stopped_before)
        pause(ROUND_PAUSE_S)


def continue_all(snapshot: Snapshot, keep: Iterable[Identity], send: Callable[[int, int], None]) -> tuple[int, int]:
    """SIGCONT to every process scanned but those the agent had stopped itself (``keep``, matched by
    start time too); (continued, left stopped)."""
    kept = set(keep)
    continued = left = 0
    for process in snapshot.values():
        if (process.pid, process.start) in kept:
            left += 1
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(process.pid, signal.SIGCONT)
            continued += 1
    return continued, left


def stop_every_agent_process() -> None:
    """The round's kill: every process this (agent) uid may signal, but this one."""
    with contextlib.suppress(ProcessLookupError):  # none left to signal
        os.kill(-1, signal.SIGSTOP)
