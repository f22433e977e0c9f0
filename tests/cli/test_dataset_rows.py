"""The dataset tools' row selection: the same rows as Atropos 0.4.0's tools on the same groups."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from atroposlib.cli import dpo, sft
from atroposlib.cli.group_text import find_common_prefix, split_common_prefix
from tests.cli.dataset_cases import make_groups
from tests.reference_tests import REFERENCE_PYTHON

HERE = Path(__file__).resolve().parent


def cases() -> list[dict[str, Any]]:
    """Every combination of the selection flags, for both tools."""
    listed = []
    for messages, allow_negative, n, diff in itertools.product([False, True], [False, True], [0, 1, 3, 8], [0.0, 0.5, 1.2]):
        listed.append({"tool": "sft", "args": [messages, n, allow_negative, diff]})
        listed.append({"tool": "dpo", "args": [messages, n, allow_negative, diff], "seed": n * 7 + int(diff * 10)})
    return listed


def our_rows(tokenizer: Any, groups: list[dict[str, Any]], case: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rng = random.Random(case.get("seed", 0))
    for group in groups:
        if case["tool"] == "sft":
            rows.extend(sft.grab_group_data(tokenizer, group, *case["args"]))
        else:
            rows.extend(dpo.grab_group_data(tokenizer, group, *case["args"], rng=rng))
    return rows


@pytest.mark.skipif(not REFERENCE_PYTHON.exists(), reason="the reference venv (bench/setup_reference.sh) is missing")
def test_rows_equal_atropos_for_every_flag_combination(tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    groups = make_groups(tokenizer, count=40, seed=3)
    listed = cases()
    request = json.dumps({"tokenizer": str(tokenizer_dir), "groups": groups, "cases": listed})
    answer = subprocess.run([str(REFERENCE_PYTHON), str(HERE / "reference_rows.py")], input=request,
                            capture_output=True, text=True, timeout=240, check=True)
    expected = json.loads(answer.stdout)
    compared = 0
    for case, reference in zip(listed, expected, strict=True):
        ours = json.loads(json.dumps(our_rows(tokenizer, groups, case)))
        assert ours == reference, case
        compared += len(ours)
    assert compared > 500  # the cases do produce rows


def test_common_prefix_is_split_by_position() -> None:
    assert find_common_prefix(["abc", "abd"]) == "ab" and find_common_prefix([]) == ""
    # Atropos splits on the prefix string: an empty prefix crashes it and a repeated one truncates.
    assert split_common_prefix(["x1", "y2"]) == ("", ["x1", "y2"])
    assert split_common_prefix(["Q: Q: a", "Q: b"]) == ("Q: ", ["Q: a", "b"])


def test_dpo_seed_makes_the_pairs_reproducible(tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    groups = make_groups(tokenizer, count=30, seed=5)
    case = {"tool": "dpo", "args": [False, 8, True, 0.0], "seed": 11}
    assert our_rows(tokenizer, groups, case) == our_rows(tokenizer, groups, case)
    other = our_rows(tokenizer, groups, {**case, "seed": 12})
    assert other != our_rows(tokenizer, groups, case)
