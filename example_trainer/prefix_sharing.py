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

The model must return its attention cache: gradient checkpointing switches the cache off
in transformers, and then the rows are run whole (`prompt_cache` returns None).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from transformers.utils.generic import ModelOutput

# transformers 5 renamed the cache argument and output (``past_key_values`` still works there, with a warning).
CACHE_ARGUMENT = "cache" if hasattr(ModelOutput, "_replace_old_cache_name") else "past_key_values"


def shared_prefix_length(tokens: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> int:
    """How many leading positions of ``[B, P]`` `tokens` are the same in every row and trained
    in none (every label `ignore_index`); 0 for a single row. At least one position is left."""
    if tokens.size(0) < 2:
        return 0
    sharable = (tokens == tokens[:1]).all(0) & (labels == ignore_index).all(0)
    length = int(sharable.int().cumprod(0).sum())
    return min(length, tokens.size(1) - 1)


def prompt_cache(model: torch.nn.Module, prefix: torch.Tensor, rows: int) -> Optional[Any]:
    """The attention cache of `prefix` (``[1, S]``) repeated for `rows` rows, still attached
    to the autograd graph of the one prefix pass; None when the model returns no cache."""
    output = model(prefix, use_cache=True)
    cache = output.get(CACHE_ARGUMENT)
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return None
    cache.batch_repeat_interleave(rows)
    return cache
