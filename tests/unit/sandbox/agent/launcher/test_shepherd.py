"""The shepherd's view of its tree, from /proc: what a signal to a process group may reach."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from corral.sandbox.agent.launcher.shepherd import descendants

# A session leader (its own group) that starts one child in its group and one in a session of its own.
TREE = (
    "import os, subprocess, sys, time\n"
    "same = subprocess.Popen(['sleep', '30'])\n"
    "other = subprocess.Popen(['sleep', '30'], start_new_session=True)\n"
    "print(same.pid, other.pid, flush=True)\n"
    "time.sleep(30)\n"
)


@pytest.fixture()
def tree() -> Iterator[tuple[int, int, int]]:
    leader = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, start_new_session=True, text=True)
    assert leader.stdout is not None
    same, other = (int(pid) for pid in leader.stdout.readline().split())
    yield leader.pid, same, other
    for pid in (same, other):
        os.kill(pid, 9)
    leader.kill()
    leader.wait()
    leader.stdout.close()


def test_the_whole_tree_below_a_process(tree: tuple[int, int, int]) -> None:
    leader, same, other = tree
    assert {leader, same, other} <= set(descendants(os.getpid()))
    assert set(descendants(leader)) == {same, other}


def test_a_group_is_the_tree_members_in_it_only(tree: tuple[int, int, int]) -> None:
    leader, same, _other = tree
    members = set(descendants(os.getpid(), group=leader))
    assert members == {leader, same}  # the setsid child left the group; nothing outside the tree is in it
    assert descendants(os.getpid(), group=os.getpid() + 10_000_000) == []
