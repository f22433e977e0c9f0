"""``atropos-sft-gen``: a supervised fine-tuning dataset from the best rollouts of scored groups.

Each group's rollouts are ranked by score; the top ``--save-top-n-per-group`` that pass the
filters become rows ``{"prefix", "completion", "score"}`` (the decoded prompt and answer),
or ``{"messages", "score"}`` with ``--save-messages``. The rows are those Atropos 0.4.0's
tool writes for the same groups; how the run gets groups and writes them is
`atroposlib.cli.dataset_tool`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

from atroposlib.cli.dataset_tool import add_common_arguments, default_registration, parse, run
from atroposlib.cli.group_text import decode_group, find_common_prefix

__all__ = ["find_common_prefix", "grab_group_data", "main"]


def grab_group_data(tok: Any, datagroup: dict[str, Any], save_messages: bool, save_top_n_per_group: int,
                    allow_negative_scores: bool = False, minimum_score_diff_max_min: float = 0.0) -> list[dict[str, Any]]:
    """The SFT rows of one group, best first."""
    if save_messages:
        samples: list[Any] = list(datagroup["messages"])
    else:
        prefix, completions = decode_group(tok, datagroup)
        samples = [(prefix, completion) for completion in completions]
    scores = datagroup["scores"]
    # Stable sort on the score alone: equal scores keep the group's order, as in Atropos.
    ranked = sorted(zip(scores, samples), key=lambda pair: pair[0], reverse=True)
    rows = [{"messages": sample, "score": score} if save_messages
            else {"prefix": sample[0], "completion": sample[1], "score": score}
            for score, sample in ranked]
    if not allow_negative_scores:
        rows = [row for row in rows if row["score"] > 0]
    if minimum_score_diff_max_min > 0:
        worst = min(scores) if scores else 0
        rows = [row for row in rows if row["score"] - worst > minimum_score_diff_max_min]
    return rows[:save_top_n_per_group]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atropos-sft-gen",
        description="Write an SFT dataset (JSONL) from the best rollouts of scored groups, read from a trajectory "
                    "API or from a `process` JSONL file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_common_arguments(parser, min_diff_default=0.0)
    parser.add_argument("--save-top-n-per-group", type=int, default=3, help="Most rows to keep from one group.")
    parser.add_argument("--tasks-per-step", type=int, default=64,
                        help="Groups per batch (registered batch size = group size x tasks per step).")
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    """Command line: exit 0 when the rows are written, 2 when refused, 130/143 when stopped."""
    args = parse(build_parser(), argv)

    def select_rows(tokenizer: Any, group: dict[str, Any]) -> list[dict[str, Any]]:
        return grab_group_data(tokenizer, group, args.save_messages, args.save_top_n_per_group,
                               args.allow_negative_scores, args.minimum_score_diff_max_min)

    sys.exit(run("atropos-sft-gen", args, select_rows, default_registration(args.group_size * args.tasks_per_step, args)))


if __name__ == "__main__":
    main()
