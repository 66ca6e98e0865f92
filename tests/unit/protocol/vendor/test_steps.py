"""The order the runner follows: a shell_call's commands share one budget and stop after a timeout."""

from __future__ import annotations

from corral.protocol import actions as a
from corral.protocol.vendor import VendorCall, next_action

from ..wired import result_of

SHELL = VendorCall(dialect="openai", tool="shell_call", call_id="c")
EXEC = a.Exec(type="exec", command="make", timeout_ms=5_000)


def test_the_first_command_gets_the_whole_budget() -> None:
    assert next_action(SHELL, EXEC, [], 3.7) is EXEC


def test_later_commands_get_what_is_left() -> None:
    action = next_action(SHELL, EXEC, [result_of({"exit_code": 0, "timed_out": False})], 1_200.4)
    assert isinstance(action, a.Exec) and action.timeout_ms == 3_799 and action.command == "make"


def test_nothing_runs_once_the_budget_is_spent_or_a_command_timed_out() -> None:
    assert next_action(SHELL, EXEC, [result_of({"exit_code": 0, "timed_out": False})], 5_000.0) is None
    assert next_action(SHELL, EXEC, [result_of({"exit_code": None, "timed_out": True})], 10.0) is None


def test_other_calls_run_as_planned() -> None:
    timed_out = [result_of({"timed_out": True})]
    assert next_action(None, EXEC, timed_out, 99_999.0) is EXEC
    assert next_action(VendorCall(dialect="openai", tool="local_shell_call", call_id="c"), EXEC, timed_out, 1e9) is EXEC
    assert next_action(VendorCall(dialect="anthropic", tool="bash", call_id="c"), EXEC, timed_out, 1e9) is EXEC
