"""Reasoning-block helpers and the evaluation table."""

from __future__ import annotations

from pathlib import Path

import pytest

from atroposlib.utils.display import display_metrics_table
from atroposlib.utils.message_history_utils import strip_thinking, truncate_thinking
from atroposlib.utils.metrics import get_std_min_max_avg

transformers = pytest.importorskip("transformers")


def test_strip_thinking() -> None:
    assert strip_thinking("a<think>x</think>b<think>y</think>") == "ab<think>y</think>"
    assert strip_thinking("no block") == "no block"


def test_truncate_thinking(tokenizer_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    assert truncate_thinking("<think>  </think>answer", tokenizer, 5) == "<think></think>answer"
    text = "<think>first paragraph that is long enough\n\nshort end</think>The answer is 4."
    budget = len(tokenizer.encode("short end", add_special_tokens=False))
    assert truncate_thinking(text, tokenizer, budget) == "<think>\n... short end\n</think>The answer is 4."
    assert truncate_thinking("<think>ok</think>x", tokenizer, 50) == "<think>\nok\n</think>x"
    assert truncate_thinking("plain", tokenizer, 1) == "plain"


def test_stats_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert get_std_min_max_avg("t", [1, 3], {}) == {"t_mean": 2.0, "t_std": 1.0, "t_max": 3, "t_min": 1}
    display_metrics_table("gsm8k_eval", {"eval/percent_correct": 0.5}, 0.0, 1.5)
    out = capsys.readouterr().out
    assert "Evaluation Results: gsm8k_eval" in out and "|percent correct|↑" in out
    assert "0.5000" in out and "Evaluation completed in 1.50 seconds" in out
