"""The sweep's pure parts (corral.sandbox.agent.launcher.sweep): /proc's fields, when two scans prove every
agent process stopped, the rounds' loop and the thaw's choice; the kernel calls are passed in."""

from __future__ import annotations

import signal

from corral.sandbox.agent.launcher.sweep import (
    Process,
    Snapshot,
    Thread,
    continue_all,
    is_agents,
    parse_start,
    parse_status,
    stable,
    stop_all,
)

STATUS = """Name:\tsleep
Umask:\t0022
State:\tT (stopped)
Tgid:\t42
Threads:\t3
Uid:\t1100\t1100\t1100\t1100
Gid:\t1100\t1100\t1100\t1100
voluntary_ctxt_switches:\t7
nonvoluntary_ctxt_switches:\t3
"""


def proc(pid: int, *states: str, switches: int = 1, start: int = 100) -> Process:
    return Process(pid, start, tuple(Thread(pid + i, s, switches) for i, s in enumerate(states)))


def test_status_gives_state_uids_and_all_switches() -> None:
    status = parse_status(STATUS)
    assert status is not None
    assert (status.state, status.uids, status.switches, status.threads) == ("T", (1100, 1100, 1100, 1100), 10, 3)
    assert parse_status("Name:\tx\nState:\tR (running)\n") is None  # cut short: not taken for anything


def test_the_start_is_read_after_the_last_parenthesis() -> None:
    fields = " ".join(str(n) for n in range(3, 30))  # field 3 (state) onwards; field 22 is "22"
    assert parse_start(f"42 (a) b (c) {fields}") == 22


def test_the_agents_processes_are_those_kill_reaches_real_or_saved_uid() -> None:
    assert is_agents((1100, 1100, 1100, 1100), 1100)
    assert is_agents((1100, 0, 999, 0), 1100)
    assert is_agents((999, 999, 1100, 999), 1100)
    # The launcher acting as the agent: effective uid only, which kill does not look at.
    assert not is_agents((999, 1100, 999, 1100), 1100)


def test_stopped_counts_traced_and_dead_threads_and_self_stopped_only_plain_stops() -> None:
    assert proc(1, "T", "t", "Z").stopped
    assert not proc(1, "T", "R").stopped
    assert not proc(1, "D").stopped  # uninterruptible: stops once it is back
    assert proc(1, "T", "Z").stopped_by_itself
    assert not proc(1, "t").stopped_by_itself
    assert not proc(1, "Z").stopped_by_itself


def test_two_scans_must_agree_on_every_thread_and_its_switches() -> None:
    before: Snapshot = {1: proc(1, "T"), 2: proc(2, "T")}
    assert stable(before, dict(before))
    # One that ran in between (continued, then stopped itself again) switched at least once.
    assert not stable(before, {1: proc(1, "T"), 2: proc(2, "T", switches=2)})
    assert not stable(before, {**before, 3: proc(3, "T")})  # forked in between
    assert not stable(before, {1: proc(1, "T"), 2: proc(2, "T", start=101)})  # the pid reused
    assert not stable({1: proc(1, "R")}, {1: proc(1, "R")})


class Board:
    """A scripted /proc: each scan takes the next snapshot (the last one repeats)."""

    def __init__(self, *scans: Snapshot) -> None:
        self.scans = list(scans)
        self.kills = 0
        self.now = 0.0

    def scan(self, starts: bool = True) -> Snapshot:
        return self.scans.pop(0) if len(self.scans) > 1 else self.scans[0]

    def stop(self) -> None:
        self.kills += 1

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_stop_rounds_go_on_until_two_scans_agree() -> None:
    running = {1: proc(1, "R"), 2: proc(2, "T")}  # 2: stopped by the agent before
    half = {1: proc(1, "T"), 2: proc(2, "T")}
    moved = {1: proc(1, "T", switches=5), 2: proc(2, "T")}  # 1 ran between the two scans
    board = Board(running, running, half, moved, moved, moved)
    outcome = stop_all(board.scan, board.stop, lambda: board.now, board.sleep, timeout_s=1.0)
    assert outcome.done and outcome.processes == 2
    assert outcome.rounds == board.kills == 3
    assert outcome.stopped_before == [(2, 100)]


def test_a_stop_that_never_holds_fails_at_its_deadline() -> None:
    board = Board({1: proc(1, "D")})
    outcome = stop_all(board.scan, board.stop, lambda: board.now, board.sleep, timeout_s=0.01)
    assert not outcome.done and board.kills == outcome.rounds > 1


def test_the_thaw_continues_all_but_those_the_agent_had_stopped_itself() -> None:
    sent: list[tuple[int, int]] = []
    snapshot = {1: proc(1, "T"), 2: proc(2, "T"), 3: proc(3, "T", start=7)}
    # 3's pid was kept with another start: a different process now, continued.
    assert continue_all(snapshot, [(2, 100), (3, 6)], lambda pid, sig: sent.append((pid, sig))) == (2, 1)
    assert sent == [(1, signal.SIGCONT), (3, signal.SIGCONT)]
