"""The environment-test harness on the simplest environment: scripted answers become scores."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from tests.environments.harness import process_groups
from tests.environments.scripted_inference import ScriptedInference


def test_arithmetic_env_scores_scripted_right_and_wrong_answers(tokenizer_dir: Path, tmp_path: Path) -> None:
    def answer(prompt: str, index: int) -> str:
        a, b = (int(x) for x in prompt.split("What is ")[-1].rstrip("?").split(" + "))
        return f"\\boxed{{{a + b if index % 2 == 0 else a + b + 1}}}"

    with ScriptedInference(answer, AutoTokenizer.from_pretrained(str(tokenizer_dir))) as server:
        groups = process_groups("arithmetic_env.py", tmp_path, server.url, tokenizer_dir, steps=2)
    assert len(groups) == 2
    for group in groups:
        assert group["scores"] == [1.0, -1.0, 1.0, -1.0]
