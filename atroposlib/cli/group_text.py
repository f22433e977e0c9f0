"""A scored group as text: each rollout decoded, split into the shared prompt and its completion.

Rollouts of one group share their prompt, so the longest common prefix of the decoded
texts is the prompt and the rest of each text is that rollout's completion. The split is by
position (``text[len(prefix):]``): splitting on the prefix string would cut a completion
that repeats its prompt, and fail on an empty prefix.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from atroposlib.envs.tokenizer_loading import load_tokenizer


def find_common_prefix(strings: Sequence[str]) -> str:
    """The longest string every one of `strings` starts with ("" for none)."""
    return os.path.commonprefix(list(strings)) if strings else ""


def split_common_prefix(texts: Sequence[str]) -> tuple[str, list[str]]:
    """``(prefix, completions)``: the common prefix of `texts` and what follows it in each."""
    prefix = find_common_prefix(texts)
    return prefix, [text[len(prefix):] for text in texts]


def decode_group(tokenizer: Any, group: dict[str, Any]) -> tuple[str, list[str]]:
    """The group's token lists decoded, as ``(prompt, completions)``."""
    return split_common_prefix([tokenizer.decode(tokens) for tokens in group["tokens"]])


def load_tool_tokenizer(name: str) -> Any:
    """The tokenizer a tool's ``--tokenizer`` names; `TokenizerUnavailable` (one line) otherwise."""
    return load_tokenizer(name, flag="--tokenizer")
