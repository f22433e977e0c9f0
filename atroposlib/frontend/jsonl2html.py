"""Render a JSONL file of scored groups as one HTML page (a group per collapsible block).

Message content is model output: it is rendered as Markdown that cannot carry markup
(`safe_markdown`), so raw tags in a completion are shown, never executed.

The page is written as a stream, so a file of any size needs little memory: each group's
summary line (``<details>`` with its scores) goes into the document, and its rollouts into
one inert ``<script type="text/html">`` block at the end, from which the page's script
builds a group's content when it is first opened. A browser then parses 10,000 small
``<details>`` rather than every rollout of the file, and the page opens in seconds. Nothing
in the block can end it early: every ``<`` of model output is escaped, and the tags the
renderer writes are never ``script``.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import numbers
import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Iterator, Optional

from atroposlib.frontend.safe_markdown import SafeMarkdown
from atroposlib.frontend.scores import GroupScores, RunSummary

HERE = Path(__file__).parent
TEMPLATE_PATH = HERE / "template.html"
STYLE_PATH = HERE / "jsonl2html.css"
SCRIPT_PATH = HERE / "jsonl2html.js"
PLACEHOLDER = re.compile(r"\{(title|style|summary_html|groups_html|group_bodies|script)\}")
# Ends each group's rollouts in the bodies block. Rendered text never holds it: it is
# replaced by the visible symbol for it (U+241E) before writing.
BODY_END = "\x1e"
# A message opening with one of these Markdown blocks (code fence, heading, list, quote,
# table) goes under its role label: on the label's line the block would be plain text.
OPENS_WITH_BLOCK = re.compile(r"\s*(?:```|~~~|#{1,6}\s|[-*+]\s|\d+[.)]\s|>|\|)")
# A Python-Markdown instance is not thread-safe: one renderer (and cache) per thread.
_local = threading.local()


def _markdown(text: str) -> str:
    if not hasattr(_local, "renderer"):
        _local.renderer = SafeMarkdown()
    return _local.renderer.render(text)


def get_score_class(score: Any) -> str:
    """CSS class of a rollout by the sign of its score ("" for a bool, NaN or non-number)."""
    if isinstance(score, bool) or not isinstance(score, numbers.Real) or math.isnan(score):
        return ""
    if score > 0:
        return "reward-positive"
    if score < 0:
        return "reward-negative"
    return "reward-zero"


def _rollout_html(entry: Any) -> str:
    """One rollout's messages as HTML: a chat message list as ``**Role**: content`` parts.

    Each part is rendered on its own, so a prompt shared by the group's rollouts is
    rendered once (cached), and an unclosed code fence cannot swallow the next message.
    """
    if isinstance(entry, list):
        parts = []
        for message in entry:
            if isinstance(message, dict):
                role, content = str(message.get("role", "")).capitalize(), str(message.get("content", ""))
                gap = "\n\n" if OPENS_WITH_BLOCK.match(content) else " "
                parts.append(_markdown(f"**{role}**:{gap}{content}"))
            else:
                parts.append(_markdown(str(message)))
        return "\n".join(parts)
    return _markdown(entry if isinstance(entry, str) else str(entry))


def _rollouts(group_data: dict[str, Any], index: int) -> tuple[list[Any], list[Any]]:
    """The group's messages and scores, cut to the shorter of the two (with a warning)."""
    messages = group_data.get("messages") or []
    scores = group_data.get("scores") or []
    if len(messages) != len(scores):
        print(f"warning: group {index} has {len(messages)} messages and {len(scores)} scores; "
              "showing the shorter", file=sys.stderr)
    count = min(len(messages), len(scores))
    return messages[:count], scores[:count]


def _items_html(messages: list[Any], scores: list[Any], stats: GroupScores, index: int) -> str:
    items = []
    for i, (message, score) in enumerate(zip(messages, scores)):
        classes = " ".join(filter(None, ("item", get_score_class(score), "best" if i in stats.best else "")))
        items.append(
            f'<div class="{classes}" id="group-{index}-item-{i}">\n'
            f"    <h4>Content {i}</h4>\n"
            f'    <div class="content-block"> {_rollout_html(message)} </div>\n'
            f"    <p><strong>Reward:</strong> {html.escape(str(score))}</p>\n"
            "</div>"
        )
    return "\n".join(items)


def _group_block(index: int, stats: GroupScores, items_html: str) -> str:
    """A group's ``<details>``: ``Group N`` and its score statistics, then its rollouts."""
    return (
        f'<details class="group" id="group-{index}" data-index="{index}"{stats.data_attributes()}>'
        f'<summary>Group {index}<span class="scores">{stats.summary_html()}</span></summary>'
        f'<div class="group-content">{items_html}</div></details>'
    )


def create_html_for_group(group_data: dict[str, Any], index: int) -> str:
    """The collapsible HTML block of one group, or "" when it has nothing to show.

    The best rollouts (highest score, when the scores differ) get the class ``best``.
    """
    messages, scores = _rollouts(group_data, index)
    if not messages:
        print(f"warning: group {index} has nothing to render", file=sys.stderr)
        return ""
    stats = GroupScores.of(scores)
    return _group_block(index, stats, _items_html(messages, scores, stats, index))


def _read_groups(source: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of `source` that have messages and scores, warning about other lines."""
    with source.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                group = json.loads(line)
            except json.JSONDecodeError:
                print(f"warning: line {number} is not JSON; skipped", file=sys.stderr)
                continue
            if not isinstance(group, dict) or "messages" not in group or "scores" not in group:
                print(f"warning: line {number} lacks messages or scores; skipped", file=sys.stderr)
                continue
            yield group


def _write_groups(source: Path, rows: IO[str], bodies: IO[str]) -> RunSummary:
    """Writes each group's summary line to `rows` and its rollouts to `bodies`."""
    summary = RunSummary()
    for group in _read_groups(source):
        index = summary.groups
        messages, scores = _rollouts(group, index)
        if not messages:
            print(f"warning: group {index} has nothing to render", file=sys.stderr)
            continue
        stats = GroupScores.of(scores)
        rows.write(_group_block(index, stats, "") + "\n")
        bodies.write(_items_html(messages, scores, stats, index).replace(BODY_END, "\u241e") + BODY_END)
        summary.add(stats)
    return summary


def _fill_template(out: IO[str], values: dict[str, str], streams: dict[str, IO[str]]) -> None:
    """Writes the template with each ``{name}`` replaced by a value or a stream's content.

    One pass over the template, so a value that looks like a placeholder stays as it is.
    """
    pieces = PLACEHOLDER.split(TEMPLATE_PATH.read_text(encoding="utf-8"))
    for position, piece in enumerate(pieces):
        if position % 2 == 0:
            out.write(piece)
        elif piece in streams:
            streams[piece].seek(0)
            shutil.copyfileobj(streams[piece], out)
        else:
            out.write(values[piece])


def generate_html(input_path: str | Path, output_path: Optional[str | Path] = None) -> Path:
    """Render `input_path` (JSONL) to `output_path` (default: same name, ``.html``).

    The page replaces `output_path` only once complete. Raises FileNotFoundError when the
    input does not exist.
    """
    source = Path(input_path)
    if not source.is_file():
        raise FileNotFoundError(f"no JSONL file at {source}")
    target = Path(output_path) if output_path else source.with_suffix(".html")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile("w+", encoding="utf-8") as rows, \
            tempfile.TemporaryFile("w+", encoding="utf-8") as bodies:
        summary = _write_groups(source, rows, bodies)
        if not summary.groups:
            rows.write("<p>No data to display.</p>")
        values = {
            "title": html.escape(f"Rendered Messages - {source.name}"),
            "style": STYLE_PATH.read_text(encoding="utf-8"),
            "summary_html": summary.html(),
            "script": SCRIPT_PATH.read_text(encoding="utf-8"),
        }
        partial = target.with_name(target.name + ".partial")
        try:
            with partial.open("w", encoding="utf-8") as out:
                _fill_template(out, values, {"groups_html": rows, "group_bodies": bodies})
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    print(f"HTML written to {target.resolve()}")
    return target


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atropos-jsonl2html",
        description="Render a JSONL file of scored groups (as `process` mode writes) as one HTML page.",
    )
    parser.add_argument("input", metavar="INPUT.jsonl", help="JSONL file, one group per line.")
    parser.add_argument("output", metavar="OUTPUT.html", nargs="?",
                        help="Page to write (default: INPUT with the .html suffix).")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Command line: exit 0 on success, 1 when the input cannot be read, 2 on bad usage."""
    args = build_parser().parse_args(argv)
    try:
        generate_html(args.input, args.output)
    except (FileNotFoundError, ValueError, OSError) as exc:
        print(f"atropos-jsonl2html: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
