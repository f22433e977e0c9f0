"""``atropos-dpo-gen``: a preference (DPO) dataset of chosen/rejected pairs from scored groups.

Within a group, rollouts ranked best first are the candidates for "chosen"; the
``--save-n-pairs-per-group`` lowest-scoring ones are the pool of "rejected". Each chosen,
in rank order, is paired with a rejected drawn at random from those scoring more than
``--minimum-score-diff-max-min`` below it (each rejected used once). Rows are
``{"prefix", "pos", "score", "neg"}`` (decoded text) or ``{"pos", "score", "neg"}`` with
message lists (``--save-messages``), as Atropos 0.4.0's tool writes them; ``--seed`` makes
the draw reproducible. The run itself is `atroposlib.cli.dataset_tool`.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any, Optional

from atroposlib.cli.dataset_tool import add_common_arguments, default_registration, parse, run
from atroposlib.cli.group_text import decode_group, find_common_prefix

__all__ = ["find_common_prefix", "grab_group_data", "main"]
REGISTERED_GROUPS_PER_BATCH = 8


def grab_group_data(tok: Any, datagroup: dict[str, Any], save_messages: bool, save_n_pairs_per_group: int,
                    allow_negative_scores: bool = False, minimum_score_diff_max_min: float = 0.0,
                    rng: Optional[random.Random] = None) -> list[dict[str, Any]]:
    """The preference pairs of one group, best chosen first; `rng` draws the rejected ones
    (the `random` module's shared generator when None)."""
    draw = rng or random
    if save_messages:
        samples: list[Any] = list(datagroup["messages"])
    else:
        prefix, completions = decode_group(tok, datagroup)
        samples = [(prefix, completion) for completion in completions]
    scored = list(zip(datagroup["scores"], samples))
    # Stable sorts on the score alone: equal scores keep the group's order, as in Atropos.
    chosen = sorted(scored, key=lambda pair: pair[0], reverse=True)
    rejected = sorted(scored, key=lambda pair: pair[0])[:save_n_pairs_per_group]
    if not allow_negative_scores:
        chosen = [pair for pair in chosen if pair[0] > 0]
    rows = []
    for score, sample in chosen[:save_n_pairs_per_group]:
        candidates = [pair for pair in rejected if pair[0] < score - minimum_score_diff_max_min]
        if not candidates:
            continue
        pick = draw.choice(candidates)
        rejected.remove(pick)
        if save_messages:
            rows.append({"pos": sample, "score": score, "neg": pick[1]})
        else:
            rows.append({"prefix": sample[0], "pos": sample[1], "score": score, "neg": pick[1][1]})
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atropos-dpo-gen",
        description="Write a DPO dataset (JSONL of chosen/rejected pairs) from scored groups, read from a trajectory "
                    "API or from a `process` JSONL file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_common_arguments(parser, min_diff_default=0.5)
    parser.add_argument("--save-n-pairs-per-group", type=int, default=3, help="Most pairs to make from one group.")
    parser.add_argument("--seed", type=int, help="Seed for the choice of rejected rollouts (reproducible datasets).")
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    """Command line: exit 0 when the pairs are written, 2 when refused, 130/143 when stopped."""
    args = parse(build_parser(), argv)
    rng = random.Random(args.seed) if args.seed is not None else None

    def select_rows(tokenizer: Any, group: dict[str, Any]) -> list[dict[str, Any]]:
        return grab_group_data(tokenizer, group, args.save_messages, args.save_n_pairs_per_group,
                               args.allow_negative_scores, args.minimum_score_diff_max_min, rng)

    batch_size = args.group_size * REGISTERED_GROUPS_PER_BATCH
    sys.exit(run("atropos-dpo-gen", args, select_rows, default_registration(batch_size, args)))


if __name__ == "__main__":
    main()
