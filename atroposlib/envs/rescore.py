"""Rescore mode: ``python my_env.py rescore --input GROUPS.jsonl`` scores saved groups again.

An author who changes a reward sees its effect on rollouts already on disk, in seconds and
without inference: each group of ``--input`` (what ``process`` writes, or ``serve`` with
``--env.data_path_to_save_groups``) is scored by the environment's `rescore_group` from the
item saved with it (the row's ``item`` field). ``--output`` gets the same rows with the new
``scores`` and the old ones in ``previous_scores``; ``--html`` a page of the rollouts whose
score changed, old and new side by side. The report on stdout counts the scores changed,
the right/wrong flips (right: a score above 0), the scores before and after as histograms,
and the groups that gained or lost a learning signal (scores that differ within the group).

Rows saved without an item are written unchanged and counted. Exit status: 0 when done,
1 when the environment cannot re-score (one line saying why), 2 for bad flags or an input
that is not a JSONL file of groups.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import math
import numbers
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from atroposlib.envs.rescore_hooks import SAVED_ITEM_FIELD, CannotRescore
from atroposlib.envs.cli import RunSettings
from atroposlib.envs.tokenizer_loading import TokenizerUnavailable
from atroposlib.frontend.jsonl2html import STYLE_PATH, _rollout_html, get_score_class

log = logging.getLogger("atroposlib.envs")

PREVIOUS_SCORES_FIELD = "previous_scores"
HISTOGRAM_BAR = 30  # characters of the longest histogram bar
HISTOGRAM_BINS = 10  # bins when the scores take more distinct values than this
NAMED = 10  # groups named by number in a line, at most


class BadInput(ValueError):
    """The input is not a JSONL file of saved groups (one line says why)."""


@dataclass
class Row:
    line: int
    data: dict[str, Any]
    new_scores: Optional[list[float]] = None  # None: not re-scored (no item, or an error)

    @property
    def old_scores(self) -> list[float]:
        return list(self.data["scores"])


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    no_item: list[int] = field(default_factory=list)  # line numbers
    errors: list[tuple[int, str]] = field(default_factory=list)

    @property
    def rescored(self) -> list[Row]:
        return [row for row in self.rows if row.new_scores is not None]


def read_groups(path: Path) -> list[Row]:
    """The saved groups of `path`; `BadInput` when it is missing or not JSONL of groups."""
    if not path.is_file():
        raise BadInput(f"--input {path}: no such file")
    rows = []
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise BadInput(f"--input {path}: line {number} is not JSON ({exc.msg})") from None
                scores = data.get("scores") if isinstance(data, dict) else None
                if not isinstance(scores, list) or not all(_is_number(s) for s in scores):
                    raise BadInput(f"--input {path}: line {number} is not a saved group (an object with a list "
                                   "of numeric scores)")
                rows.append(Row(number, data))
    except UnicodeDecodeError:
        raise BadInput(f"--input {path}: not a text file") from None
    if not rows:
        raise BadInput(f"--input {path}: holds no groups")
    return rows


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _checked_scores(scores: Any, expected: int) -> list[float]:
    if not isinstance(scores, (list, tuple)) or len(scores) != expected:
        count = len(scores) if isinstance(scores, (list, tuple)) else type(scores).__name__
        raise ValueError(f"rescore_group returned {count} scores for {expected} rollouts")
    if not all(_is_number(s) for s in scores):
        raise ValueError(f"rescore_group returned a score that is not a finite number: {list(scores)!r}")
    return [float(s) for s in scores]


async def rescore_rows(env: Any, rows: list[Row]) -> Report:
    """Score each row that has an item again; `CannotRescore` propagates (the env's one line)."""
    report = Report(rows)
    for row in rows:
        if SAVED_ITEM_FIELD not in row.data:
            report.no_item.append(row.line)
            continue
        group = {key: value for key, value in row.data.items()
                 if key not in (SAVED_ITEM_FIELD, PREVIOUS_SCORES_FIELD)}
        try:
            scores = await env.rescore_group(group, row.data[SAVED_ITEM_FIELD])
            row.new_scores = _checked_scores(scores, len(row.old_scores))
        except (CannotRescore, TokenizerUnavailable):
            raise
        except Exception as exc:
            log.debug("line %d could not be re-scored", row.line, exc_info=True)
            text = str(exc).strip().splitlines()
            report.errors.append((row.line, f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__))
    return report


def write_rows(rows: list[Row], path: Path) -> None:
    """The rows, re-scored ones with their new scores (old ones in ``previous_scores``), written
    to `path` whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as out:
        for row in rows:
            data = row.data
            if row.new_scores is not None:
                data = {**data, "scores": row.new_scores, PREVIOUS_SCORES_FIELD: row.old_scores}
            out.write(json.dumps(data) + "\n")
    os.replace(partial, path)


# -- the report -------------------------------------------------------------------------------------
def _format(score: float) -> str:
    return f"{score:g}"


def _named(numbers_: list[int], noun: str = "line") -> str:
    shown = ", ".join(str(n) for n in numbers_[:NAMED])
    more = f" and {len(numbers_) - NAMED} more" if len(numbers_) > NAMED else ""
    return f"{noun}{'s' if len(numbers_) > 1 else ''} {shown}{more}"


def _bins(values: list[float]) -> list[tuple[str, Any]]:
    """(label, test) per histogram bar: one per distinct value when there are few, else equal bins."""
    distinct = sorted(set(values))
    if len(distinct) <= HISTOGRAM_BINS:
        return [(_format(v), (lambda s, v=v: s == v)) for v in distinct]
    low, high = distinct[0], distinct[-1]
    width = (high - low) / HISTOGRAM_BINS
    bins = []
    for k in range(HISTOGRAM_BINS):
        start, end = low + k * width, low + (k + 1) * width
        last = k == HISTOGRAM_BINS - 1
        test = (lambda s, a=start, b=end, last=last: a <= s <= b if last else a <= s < b)
        bins.append((f"{start:.3g} to {end:.3g}", test))
    return bins


def histogram_lines(before: list[float], after: list[float]) -> list[str]:
    bins = _bins(before + after)
    counts = [(label, sum(map(test, before)), sum(map(test, after))) for label, test in bins]
    widest = max([max(b, a) for _, b, a in counts] + [1])
    label_width = max(len(label) for label in ["score", *(label for label, _, _ in counts)])
    lines = [f"  {'score':>{label_width}}  {'before':>6}  {'after':>6}"]
    for label, b, a in counts:
        bar = lambda n: "#" * round(HISTOGRAM_BAR * n / widest)  # noqa: E731
        lines.append(f"  {label:>{label_width}}  {b:>6}  {a:>6}  {bar(b):<{HISTOGRAM_BAR}} | {bar(a)}".rstrip())
    return lines


def _has_signal(scores: list[float]) -> bool:
    return len(set(scores)) > 1


def report_lines(report: Report, source: Path, output: Path, page: Path, env_name: str) -> list[str]:
    rescored = report.rescored
    rollouts = sum(len(row.old_scores) for row in report.rows)
    lines = [f"read {len(report.rows)} groups ({rollouts} rollouts) from {source}; re-scored "
             f"{len(rescored)} with {env_name}"]
    if report.no_item:
        lines.append(f"{len(report.no_item)} groups have no saved item ({_named(report.no_item)}): written "
                     "unchanged (saved before items were kept, or the item was not JSON)")
    for number, error in report.errors[:NAMED]:
        lines.append(f"line {number}: rescore_group failed, written unchanged: {error}")
    if len(report.errors) > NAMED:
        lines.append(f"{len(report.errors) - NAMED} more groups failed the same way or otherwise")
    if not rescored:
        return lines + [f"nothing re-scored; wrote {output} unchanged"]
    pairs = [(old, new) for row in rescored for old, new in zip(row.old_scores, row.new_scores)]
    changed_groups = [row for row in rescored if row.old_scores != row.new_scores]
    changed = sum(old != new for old, new in pairs)
    to_wrong = sum(old > 0 >= new for old, new in pairs)
    to_right = sum(new > 0 >= old for old, new in pairs)
    lines.append(f"scores changed: {changed} of {len(pairs)} rollouts, in {len(changed_groups)} of "
                 f"{len(rescored)} groups")
    lines.append(f"right -> wrong: {to_wrong}, wrong -> right: {to_right} (right: a score above 0)")
    before = sum(old > 0 for old, _ in pairs) / len(pairs)
    after = sum(new > 0 for _, new in pairs) / len(pairs)
    mean_before = sum(old for old, _ in pairs) / len(pairs)
    mean_after = sum(new for _, new in pairs) / len(pairs)
    lines.append(f"right: {before:.1%} before, {after:.1%} after; mean score {mean_before:.3g} before, "
                 f"{mean_after:.3g} after")
    lines.append("scores before and after:")
    lines += histogram_lines([old for old, _ in pairs], [new for _, new in pairs])
    gained = [row.line for row in rescored if _has_signal(row.new_scores) and not _has_signal(row.old_scores)]
    lost = [row.line for row in rescored if _has_signal(row.old_scores) and not _has_signal(row.new_scores)]
    signal_before = sum(_has_signal(row.old_scores) for row in rescored)
    signal_after = sum(_has_signal(row.new_scores) for row in rescored)
    lines.append(f"groups with a learning signal (scores not all alike): {signal_before} before, "
                 f"{signal_after} after; gained {len(gained)}, lost {len(lost)}")
    if gained:
        lines.append(f"  gained: {_named(gained)}")
    if lost:
        lines.append(f"  lost: {_named(lost)}")
    lines.append(f"wrote {output}")
    lines.append(f"changed rollouts side by side: {page}" if changed else f"no score changed; {page} says so")
    return lines


# -- the page ----------------------------------------------------------------------------------------
PAGE_STYLE = """
.rescored { width: 100%; border-collapse: collapse; background: #fff; margin-bottom: 1.2rem; }
.rescored th, .rescored td { border: 1px solid #ddd; padding: 0.4rem 0.6rem; vertical-align: top; text-align: left; }
.rescored td.score { white-space: nowrap; font-weight: 600; width: 6rem; }
.rescored td.score.reward-positive { background: #e8f5e9; }
.rescored td.score.reward-zero { background: #fff8e1; }
.rescored td.score.reward-negative { background: #fdecee; }
"""


def _score_cell(score: float) -> str:
    return f'<td class="score {get_score_class(score)}">{html.escape(_format(score))}</td>'


def write_page(report: Report, source: Path, path: Path) -> None:
    """The rollouts whose score changed, a table per group: before, after, the rollout."""
    sections = []
    for row in report.rescored:
        cells = []
        for index, (old, new) in enumerate(zip(row.old_scores, row.new_scores)):
            if old == new:
                continue
            messages = (row.data.get("messages") or [])
            shown = _rollout_html(messages[index]) if index < len(messages) else "<p>(no messages saved)</p>"
            cells.append(f'<tr id="line-{row.line}-rollout-{index}"><td>{index}</td>{_score_cell(old)}'
                         f'{_score_cell(new)}<td class="content-block">{shown}</td></tr>')
        if cells:
            scores = f"{', '.join(map(_format, row.old_scores))} &rarr; {', '.join(map(_format, row.new_scores))}"
            sections.append(f'<h2 id="line-{row.line}">Group on line {row.line} <small>{scores}</small></h2>\n'
                            '<table class="rescored"><tr><th>#</th><th>before</th><th>after</th>'
                            '<th>the rollout</th></tr>\n' + "\n".join(cells) + "</table>")
    title = html.escape(f"Re-scored rollouts of {source.name}")
    pairs = [(old, new) for row in report.rescored for old, new in zip(row.old_scores, row.new_scores)]
    changed = sum(old != new for old, new in pairs)
    summary = (f"<p>{changed} of {len(pairs)} rollouts changed score, in {len(sections)} of "
               f"{len(report.rescored)} groups; each group below shows its scores before &rarr; after, "
               "then its changed rollouts.</p>")
    body = summary + "\n" + "\n".join(sections) if sections else "<p>No score changed.</p>"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
        f"<style>\n{STYLE_PATH.read_text(encoding='utf-8')}\n{PAGE_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{title}</h1>\n{body}\n</body>\n</html>\n", encoding="utf-8")


# -- the mode ------------------------------------------------------------------------------------------
def _paths(settings: RunSettings) -> tuple[Path, Path, Path]:
    files = settings.rescore_files
    if not files.get("input"):
        raise BadInput("rescore needs --input FILE.jsonl (groups written by process, or by serve with "
                       "--env.data_path_to_save_groups)")
    source = Path(files["input"])
    output = Path(files["output"]) if files.get("output") else source.with_name(f"{source.stem}_rescored.jsonl")
    page = Path(files["html"]) if files.get("html") else output.with_suffix(".html")
    if output.resolve() == source.resolve() or page.resolve() == source.resolve():
        raise BadInput(f"--output and --html must not be the input {source}")
    return source, output, page


def rescore(env_cls: Any, settings: RunSettings, prog: str) -> int:
    """Run rescore mode; the exit status (0 done, 1 the env cannot re-score, 2 bad input)."""
    from atroposlib.envs.runner import build_env

    try:
        source, output, page = _paths(settings)
        rows = read_groups(source)
    except BadInput as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    env = build_env(env_cls, settings, tokenizer_on_demand=True)
    try:
        report = asyncio.run(rescore_rows(env, rows))
    except CannotRescore as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except TokenizerUnavailable as exc:
        print(f"{prog}: the saved groups have no messages, and decoding their tokens needs the tokenizer: {exc}",
              file=sys.stderr)
        return 1
    finally:
        env.close_jsonl_writer()
    write_rows(rows, output)
    write_page(report, source, page)
    print("\n".join(report_lines(report, source, output, page, type(env).__name__)))
    return 0
