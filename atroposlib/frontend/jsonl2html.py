"""Render a JSONL file of scored groups as one HTML page (a group per collapsible block).

Message content is model output, so it is HTML-escaped before Markdown rendering: raw
tags in a completion are shown, never executed.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import numbers
import sys
from pathlib import Path
from typing import Any, Optional

import markdown

log = logging.getLogger("atroposlib.frontend")

TEMPLATE_PATH = Path(__file__).with_name("template.html")
MARKDOWN_EXTENSIONS = ["fenced_code", "tables", "nl2br"]


def get_score_class(score: Any) -> str:
    """CSS class of a rollout by the sign of its score."""
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        return ""
    if score > 0:
        return "reward-positive"
    if score < 0:
        return "reward-negative"
    return "reward-zero"


def _message_markdown(entry: Any) -> str:
    if isinstance(entry, str):
        return html.escape(entry, quote=False)
    if isinstance(entry, list):
        parts = []
        for message in entry:
            if isinstance(message, dict):
                role = html.escape(str(message.get("role", "")).capitalize(), quote=False)
                parts.append(f"**{role}**: {html.escape(str(message.get('content', '')), quote=False)}")
            else:
                parts.append(html.escape(str(message), quote=False))
        return "\n\n".join(parts)
    return html.escape(str(entry), quote=False)


def create_html_for_group(group_data: dict[str, Any], index: int) -> str:
    """The collapsible HTML block of one group, or "" when it has nothing to show."""
    messages = group_data.get("messages") or []
    scores = group_data.get("scores") or []
    if len(messages) != len(scores):
        print(f"warning: group {index} has {len(messages)} messages and {len(scores)} scores; "
              "showing the shorter", file=sys.stderr)
    count = min(len(messages), len(scores))
    if count == 0:
        print(f"warning: group {index} has nothing to render", file=sys.stderr)
        return ""
    items = []
    for i in range(count):
        rendered = markdown.markdown(_message_markdown(messages[i]), extensions=MARKDOWN_EXTENSIONS)
        items.append(
            f'<div class="item {get_score_class(scores[i])}" id="group-{index}-item-{i}">\n'
            f"    <h4>Content {i}</h4>\n"
            f'    <div class="content-block"> {rendered} </div>\n'
            f"    <p><strong>Reward:</strong> {html.escape(str(scores[i]))}</p>\n"
            "</div>"
        )
    return (
        f"<details><summary>Group {index}</summary><div class=\"group-content\">"
        + "\n".join(items)
        + "</div></details>"
    )


def generate_html(input_path: str | Path, output_path: Optional[str | Path] = None) -> Path:
    """Render `input_path` (JSONL) to `output_path` (default: same name, ``.html``)."""
    source = Path(input_path)
    if not source.is_file():
        raise FileNotFoundError(f"no JSONL file at {source}")
    target = Path(output_path) if output_path else source.with_suffix(".html")
    target.parent.mkdir(parents=True, exist_ok=True)
    blocks = []
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
            block = create_html_for_group(group, len(blocks))
            if block:
                blocks.append(block)
    groups_html = "\n".join(blocks) if blocks else "<p>No data to display.</p>"
    title = html.escape(f"Rendered Messages - {source.name}")
    page = TEMPLATE_PATH.read_text(encoding="utf-8").replace("{title}", title).replace("{groups_html}", groups_html)
    target.write_text(page, encoding="utf-8")
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
