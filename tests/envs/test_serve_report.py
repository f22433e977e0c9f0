"""Serve mode's messages: spaced-out waiting lines, progress lines and the final summary."""

from __future__ import annotations

import time
from types import SimpleNamespace

from atroposlib.envs.accept import SkipCounter
from atroposlib.envs.serve_report import ServeReport, Throttle, duration


def test_durations_read_naturally() -> None:
    assert [duration(s) for s in (0.4, 42, 187, 3900)] == ["0s", "42s", "3m07s", "1h05m00s"]


def test_throttle_says_it_at_once_then_once_per_interval() -> None:
    throttle = Throttle(0.2)
    assert throttle.due() is not None
    assert throttle.due() is None
    time.sleep(0.25)
    waited = throttle.due()
    assert waited is not None and waited >= 0.2
    assert Throttle(0.2, immediate=False).due() is None


def test_summary_counts_groups_rollouts_and_drops() -> None:
    skipped = SkipCounter(same_scores=5, too_long=1)
    env = SimpleNamespace(groups_sent=12, rollouts_sent=48, skipped=skipped, curr_step=3, workers=set(),
                          config=SimpleNamespace(total_steps=10))
    line = ServeReport(30).summary(env, "SIGINT received")
    assert line.startswith("serve stopped (SIGINT received) after 0s: step 3/10")
    assert "12 groups sent (48 rollouts), 6 dropped (same_scores 5, too_long 1)" in line
    assert line.endswith("--env.ensure_scores_are_not_same false keeps groups whose scores are all equal")
