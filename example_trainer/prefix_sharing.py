"""A group's common prompt through the model once, instead of once per rollout.

The rollouts of a GRPO group share their prompt: eight answers to one question repeat the
same leading tokens eight times, and on a short-answer task the prompt is most of every
row. When a micro-batch's rows start with the same tokens and none of those positions is
trained (`shared_prefix_length`), the forward pass runs the prefix for one row, repeats its
attention keys and values for every row (`prompt_cache`), and runs only the rest of each row
on top of them. Causal attention makes every later position see exactly what it saw in the
full rows, so the logits, and the gradients that flow back through the repeated keys and
values into the one prefix pass, are those of the full forward (up to floating-point
summation order); only the positions computed shrink.

The prefix's pass is a forward pass of its own, with its per-layer overhead: on a 2-core CPU
it costs about as much as 120 more positions (`bench/train_step.py`: micro-batches of 4
rollouts sharing a 36-token prompt ran 6% slower shared; of 8 sharing 47 tokens, 1.27x
faster in float32 and 1.05x in bfloat16). So a micro-batch shares only when that saves at
least `MIN_POSITIONS_SAVED` positions.

The model must return its attention cache: gradient checkpointing switches the cache off
in transformers, and then the rows are run whole (`prompt_cache` returns None).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from transformers.utils.generic import ModelOutput

# transformers 5 renamed the cache argument and output (``past_key_values`` still works there, with a warning).
CACHE_ARGUMENT = "cache" if hasattr(ModelOutput, "_replace_old_cache_name") else "past_key_values"
# Positions a shared prefix must save (rows - 1 times its length) to pay for its own forward pass.
MIN_POSITIONS_SAVED = 128


def shared_prefix_length(tokens: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> int:
    """How many leading positions of ``[B, P]`` `tokens` are the same in every row and trained
    in none (every label `ignore_index`); 0 for a single row. At least one position is left.
    (Whether sharing them pays off: `worth_sharing`.)"""
    if tokens.size(0) < 2:
        return 0
    sharable = (tokens == tokens[:1]).all(0) & (labels == ignore_index).all(0)
    length = int(sharable.int().cumprod(0).sum())
    return min(length, tokens.size(1) - 1)


def worth_sharing(rows: int, prefix: int) -> bool:
    """Whether running a `prefix` once for `rows` rows saves enough positions to pay for its pass."""
    return (rows - 1) * prefix >= MIN_POSITIONS_SAVED


def prompt_cache(model: torch.nn.Module, prefix: torch.Tensor, rows: int) -> Optional[Any]:
    """The attention cache of `prefix` (``[1, S]``) repeated for `rows` rows, still attached
    to the autograd graph of the one prefix pass; None when the model returns no cache."""
    output = model(prefix, use_cache=True)
    cache = output.get(CACHE_ARGUMENT)
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return None
    cache.batch_repeat_interleave(rows)
    return cache
