"""The swarm driver's reading of its nodes (SandboxRuntime.nodes) and of a sandbox that Swarm's
drain stopped (NODE_DRAINED), from the manager's records as Docker 20.10 gives them."""

from __future__ import annotations

from typing import Any

import pytest

from corral.runtime import NODE_DRAINED, NODE_LOST, ExitInfo, NodeInfo
from corral.runtime.swarm.nodes import drained_exit, node_info


def _node(host: str, state: str, availability: str) -> dict[str, Any]:
    return {
        "ID": f"id-{host}",
        "Description": {"Hostname": host},
        "Status": {"State": state, "Addr": "10.0.0.1"},
        "Spec": {"Availability": availability, "Role": "worker"},
    }


@pytest.mark.parametrize(
    ("state", "availability", "expected"),
    [
        ("ready", "active", NodeInfo("w", True, "active")),
        ("ready", "pause", NodeInfo("w", True, "pause")),
        ("ready", "drain", NodeInfo("w", True, "drain")),
        ("down", "active", NodeInfo("w", False, "active")),
        ("disconnected", "active", NodeInfo("w", False, "active")),
        ("unknown", "active", NodeInfo("w", False, "active")),
        ("ready", "something-newer", NodeInfo("w", True, "pause")),  # unknown: takes nothing new, ends nothing
    ],
)
def test_a_node_record_as_the_runtimes(state: str, availability: str, expected: NodeInfo) -> None:
    assert node_info(_node("w", state, availability)) == expected


def test_only_a_ready_active_node_takes_sessions() -> None:
    assert NodeInfo("w", True, "active").takes_sessions
    assert not NodeInfo("w", True, "pause").takes_sessions
    assert not NodeInfo("w", True, "drain").takes_sessions
    assert not NodeInfo("w", False, "active").takes_sessions


def test_a_node_without_a_host_name_is_named_by_its_id() -> None:
    assert node_info({"ID": "abc", "Status": {"State": "ready"}, "Spec": {"Availability": "active"}}).name == "abc"


SHUT_DOWN = {"Status": {"State": "shutdown", "ContainerStatus": {"ExitCode": 137}}}
FAILED = {"Status": {"State": "failed", "ContainerStatus": {"ExitCode": 1}}}


def test_a_task_shut_down_on_a_drained_node_ended_node_drained() -> None:
    info = ExitInfo("exited", 137, False, "w2")
    assert drained_exit(info, SHUT_DOWN, NodeInfo("w2", True, "drain")) == ExitInfo(NODE_DRAINED, 137, False, "w2")


@pytest.mark.parametrize(
    ("info", "task", "node"),
    [
        (ExitInfo("exited", 137, False, "w2"), SHUT_DOWN, NodeInfo("w2", True, "active")),  # removed, not drained
        (ExitInfo("exited", 137, False, "w2"), SHUT_DOWN, NodeInfo("w2", True, "pause")),  # pause stops nothing
        (ExitInfo("dead", 1, False, "w2"), FAILED, NodeInfo("w2", True, "drain")),  # it crashed by itself
        (ExitInfo(NODE_LOST, None, False, "w2"), None, NodeInfo("w2", False, "drain")),  # no task to read
        (None, SHUT_DOWN, NodeInfo("w2", True, "drain")),  # it lives
        (ExitInfo("exited", 137, False, "w2"), SHUT_DOWN, None),  # its node is gone from the listing
    ],
)
def test_any_other_end_stays_as_it_was(
    info: ExitInfo | None, task: dict[str, Any] | None, node: NodeInfo | None
) -> None:
    assert drained_exit(info, task, node) == info
