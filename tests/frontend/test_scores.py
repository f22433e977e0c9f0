"""Group and file score statistics of the HTML report."""

from __future__ import annotations

import math
import re

from atroposlib.frontend.scores import GroupScores, RunSummary, fmt, histogram_svg, numeric


def test_numeric_and_format() -> None:
    assert [numeric(s) for s in (1, 0.5, True, "1", None, math.inf, math.nan)] == [
        1.0, 0.5, None, None, None, None, None]
    assert [fmt(v) for v in (1.0, 0.0, -0.0, 0.375, 2 / 3, 12345.6, 1e-7)] == [
        "1", "0", "0", "0.375", "0.6667", "1.235e+04", "1e-07"]


def test_group_scores_best_and_attributes() -> None:
    stats = GroupScores.of([0.0, 1.0, "n/a", 1.0])
    assert stats.best == {1, 3} and stats.differ and stats.count == 4
    assert 'data-min="0.0" data-mean="0.6666666666666666" data-max="1.0" data-spread="1.0"' in stats.data_attributes()
    assert GroupScores.of([1, 1]).best == frozenset()
    assert GroupScores.of(["x"]).data_attributes() == ' data-rollouts="1"'


def test_run_summary_counts_and_histogram() -> None:
    summary = RunSummary()
    for scores in ([1.0, 0.0], [0.5, 0.5], ["x", -1.0]):
        summary.add(GroupScores.of(scores))
    facts = dict(re.findall(r'<dd data-fact="([^"]+)">([^<]*)</dd>', summary.html()))
    assert facts == {"groups": "3", "rollouts": "6", "mean score": "0.2", "score range": "-1 to 1",
                     "groups whose scores differ": "1 (33%)", "rollouts without a numeric score": "1"}
    assert RunSummary().html() == '<p class="empty">No groups.</p>'


def test_histogram_bars_per_score_or_binned() -> None:
    discrete = histogram_svg([0.0, 0.0, 1.0, -0.5])
    assert re.findall(r"<title>([^<]*)</title>", discrete) == ["-0.5: 1 rollouts", "0: 2 rollouts", "1: 1 rollouts"]
    assert [cls for cls in re.findall(r'<g class="bar (\w+)">', discrete)] == ["negative", "zero", "positive"]
    binned = histogram_svg([i / 100 for i in range(101)])
    titles = re.findall(r"<title>([^<]*)</title>", binned)
    assert len(titles) == 20 and titles[0] == "0 to 0.05: 5 rollouts" and titles[-1] == "0.95 to 1: 6 rollouts"
    assert "<script" not in binned and "href" not in binned
