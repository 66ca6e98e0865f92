"""The reaper's verdict on a session's controller (corral.gateway.vitals): dead once it restarted more
than its allowance within the window, or stayed silent too long; alive through a slow answer or an
occasional restart."""

from __future__ import annotations

from corral.gateway.vitals import ControllerWatch


def test_a_controller_that_keeps_its_boot_lives_on() -> None:
    watch = ControllerWatch(max_restarts=2, window_s=60, dead_after_s=10)
    assert all(watch.saw("s", "b1", float(t)) is None for t in range(100))


def test_restarts_past_the_allowance_within_the_window_are_death() -> None:
    watch = ControllerWatch(max_restarts=2, window_s=60, dead_after_s=10)
    assert watch.saw("s", "b1", 0.0) is None
    assert watch.saw("s", "b2", 1.0) is None
    assert watch.saw("s", "b3", 2.0) is None
    assert watch.saw("s", "b4", 3.0) == "restarted 3 times in 60 s"


def test_restarts_spread_beyond_the_window_are_forgiven() -> None:
    watch = ControllerWatch(max_restarts=1, window_s=10, dead_after_s=100)
    assert [watch.saw("s", f"b{n}", n * 11.0) for n in range(6)] == [None] * 6


def test_silence_for_the_dead_time_is_death_and_an_answer_resets_it() -> None:
    watch = ControllerWatch(max_restarts=5, window_s=60, dead_after_s=10)
    assert watch.saw("s", None, 0.0) is None  # first seen: watched from now
    assert watch.saw("s", None, 9.0) is None
    assert watch.saw("s", "b1", 9.5) is None
    assert watch.saw("s", None, 19.0) is None
    assert watch.saw("s", None, 19.5) == "no answer for 10 s"


def test_a_controller_that_flickers_up_between_kills_is_still_silent() -> None:
    watch = ControllerWatch(max_restarts=50, window_s=60, dead_after_s=10)
    assert watch.saw("s", "b0", 0.0) is None
    verdicts = [watch.saw("s", f"b{t}" if t % 3 == 0 else None, float(t)) for t in range(1, 11)]
    assert verdicts[-1] == "no answer for 10 s" and verdicts[:-1] == [None] * 9


def test_a_controller_that_names_no_boot_is_judged_by_its_answers_alone() -> None:
    watch = ControllerWatch(max_restarts=1, window_s=60, dead_after_s=10)
    assert [watch.saw("s", "", float(t)) for t in range(5)] == [None] * 5


def test_sessions_no_longer_watched_are_forgotten() -> None:
    watch = ControllerWatch(max_restarts=1, window_s=60, dead_after_s=10)
    watch.saw("gone", None, 0.0)
    watch.keep_only(["other"])
    assert watch.saw("gone", None, 20.0) is None  # watched afresh
