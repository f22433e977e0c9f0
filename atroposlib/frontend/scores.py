"""Score statistics of the HTML report: per group (its summary line) and per file (the header).

A score counts as numeric when it is a finite real number that is not a bool; other
scores (strings, None, NaN) are shown as written and left out of every statistic.
"""

from __future__ import annotations

import html
import math
import numbers
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Optional

# Up to this many distinct scores, the histogram has one bar per score (0/1 rewards,
# partial credit); past it, equal-width bins.
MAX_DISTINCT_BARS = 12
BINS = 20
CHART_WIDTH, CHART_HEIGHT, AXIS_HEIGHT = 640, 120, 18
WIDEST_BAR_SLOT = 72


def numeric(score: Any) -> Optional[float]:
    """`score` as a float when it counts as numeric, else None."""
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        return None
    value = float(score)
    return value if math.isfinite(value) else None


def fmt(value: float) -> str:
    """A score as people read it: at most 4 significant digits, no trailing zeros, no -0."""
    text = f"{value:.4g}"
    return "0" if text == "-0" else text


@dataclass(frozen=True)
class GroupScores:
    """Statistics of one group's numeric scores. `best` holds the rollouts at the maximum
    when the scores differ: a group whose rollouts all scored the same has no best one."""

    count: int
    numeric: tuple[float, ...]
    best: frozenset[int]

    @classmethod
    def of(cls, scores: list[Any]) -> "GroupScores":
        values = [numeric(score) for score in scores]
        present = tuple(value for value in values if value is not None)
        best: frozenset[int] = frozenset()
        if present and max(present) > min(present):
            best = frozenset(i for i, value in enumerate(values) if value == max(present))
        return cls(len(scores), present, best)

    @property
    def differ(self) -> bool:
        return bool(self.best)

    def data_attributes(self) -> str:
        """The statistics as ``data-*`` attributes, for the page's sort and filter."""
        attributes = f' data-rollouts="{self.count}"'
        if self.numeric:
            low, high = min(self.numeric), max(self.numeric)
            mean = sum(self.numeric) / len(self.numeric)
            attributes += f' data-min="{low!r}" data-mean="{mean!r}" data-max="{high!r}" data-spread="{high - low!r}"'
        return attributes

    def summary_html(self) -> str:
        """The statistics as shown after ``Group N`` in the group's summary line."""
        rollouts = f'<span class="rollouts">{self.count} rollout{"s" if self.count != 1 else ""}</span>'
        if not self.numeric:
            return f' {rollouts} <span class="no-scores">no numeric scores</span>'
        low, high = min(self.numeric), max(self.numeric)
        mean = sum(self.numeric) / len(self.numeric)
        parts = [f'<span class="stat">{name} <b>{fmt(value)}</b></span>'
                 for name, value in (("min", low), ("mean", mean), ("max", high))]
        flag = [] if self.differ else ['<span class="flat">all equal</span>']
        # Spaces as well as margins: copied text and screen readers keep the words apart.
        return " " + " ".join([rollouts, *parts, *flag])


class RunSummary:
    """What the page's header reports about the whole file, gathered group by group."""

    def __init__(self) -> None:
        self.groups = 0
        self.rollouts = 0
        self.differing = 0
        self.scores = array("d")

    def add(self, group: GroupScores) -> None:
        self.groups += 1
        self.rollouts += group.count
        self.differing += group.differ
        self.scores.extend(group.numeric)

    def html(self) -> str:
        """Counts, the mean score and the histogram of rollout scores."""
        if not self.groups:
            return '<p class="empty">No groups.</p>'
        facts = [("groups", f"{self.groups:,}"), ("rollouts", f"{self.rollouts:,}")]
        if self.scores:
            facts += [("mean score", fmt(sum(self.scores) / len(self.scores))),
                      ("score range", f"{fmt(min(self.scores))} to {fmt(max(self.scores))}")]
        facts.append(("groups whose scores differ",
                      f"{self.differing:,} ({100 * self.differing / self.groups:.0f}%)"))
        unscored = self.rollouts - len(self.scores)
        if unscored:
            facts.append(("rollouts without a numeric score", f"{unscored:,}"))
        items = "".join(f'<div><dt>{name}</dt><dd data-fact="{name}">{value}</dd></div>' for name, value in facts)
        return f'<dl class="facts">{items}</dl>' + (histogram_svg(self.scores) if self.scores else "")


def _bars(scores: Iterable[float]) -> list[tuple[str, float, int]]:
    """Histogram bars as (label, value that colours the bar, count), lowest scores first."""
    counts = Counter(scores)
    if len(counts) <= MAX_DISTINCT_BARS:
        return [(fmt(value), value, count) for value, count in sorted(counts.items())]
    low, high = min(counts), max(counts)
    width = (high - low) / BINS
    binned = [0] * BINS
    for value, count in counts.items():
        binned[min(int((value - low) * BINS / (high - low)), BINS - 1)] += count
    return [(f"{fmt(low + i * width)} to {fmt(low + (i + 1) * width)}", low + (i + 0.5) * width, count)
            for i, count in enumerate(binned)]


def _colour(value: float) -> str:
    """The bar colour of the reward class a score of `value` gets."""
    return "positive" if value > 0 else "negative" if value < 0 else "zero"


def histogram_svg(scores: Iterable[float]) -> str:
    """An inline SVG bar chart of the rollout scores (no script, no external asset)."""
    bars = _bars(scores)
    tallest = max(count for _, _, count in bars)
    slot = min(WIDEST_BAR_SLOT, CHART_WIDTH / len(bars))
    shapes = []
    for i, (label, value, count) in enumerate(bars):
        height = max(1.0, (CHART_HEIGHT - 16) * count / tallest)
        x, y = i * slot + slot * 0.1, CHART_HEIGHT - height
        tip = html.escape(f"{label}: {count:,} rollouts")
        shapes.append(f'<g class="bar {_colour(value)}"><title>{tip}</title>'
                      f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.8:.1f}" height="{height:.1f}"/>'
                      f'<text class="count" x="{x + slot * 0.4:.1f}" y="{y - 3:.1f}">{count:,}</text></g>')
        if len(bars) <= MAX_DISTINCT_BARS or i in (0, len(bars) - 1):
            axis = label if len(bars) <= MAX_DISTINCT_BARS else label.split(" to ")[0 if i == 0 else 1]
            shapes.append(f'<text class="axis" x="{x + slot * 0.4:.1f}" y="{CHART_HEIGHT + AXIS_HEIGHT - 4}">'
                          f"{html.escape(axis)}</text>")
    height = CHART_HEIGHT + AXIS_HEIGHT
    return (f'<figure class="histogram"><svg viewBox="0 0 {slot * len(bars):.0f} {height}" role="img" '
            f'aria-label="histogram of rollout scores">{"".join(shapes)}</svg>'
            "<figcaption>Rollout scores</figcaption></figure>")
