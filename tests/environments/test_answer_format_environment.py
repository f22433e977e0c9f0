"""answer_format_environment/: the format catalogue's checks, and AnswerFormatEnv scoring format
compliance offline (process and evaluate modes against the scripted server, the project's fixtures)."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from atroposlib.envs.base import APIServerConfig
from environments.answer_format_environment.answer_format_environment import (
    AnswerFormatEnv,
    AnswerFormatEnvConfig,
    item_from_row,
)
from environments.answer_format_environment.answer_formats import (
    FORMAT_SPECS,
    AnswerFormat,
    extract_answer,
    spec_of,
)
from tests.environments.harness import ROOT, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

SCRIPT = "answer_format_environment/answer_format_environment.py"
FIXTURES = ROOT / "environments" / "fixtures" / "answer_format"
THINK = "<think>Let me decide how to lay the answer out in the requested format.</think>\n"
GSM8K_QUESTIONS = {json.loads(line)["question"] for line in (FIXTURES / "gsm8k.jsonl").read_text().splitlines()}


def example_in(prompt: str) -> str:
    return re.search(r"Example:\n(.*?)<\|end\|>", prompt, re.DOTALL).group(1)


def follows_half(prompt: str, index: int) -> str:
    """Choices 0 and 3 follow the format; 1 skips the thinking block, 2 uses the format twice."""
    example = example_in(prompt)
    return [THINK + example, "I will answer straight away without thinking.\n" + example,
            THINK + example + "\n" + example, THINK + "\n" + example][index % 4]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.mark.parametrize("answer_format", list(AnswerFormat), ids=lambda f: f.value)
def test_every_format_accepts_its_example_once_after_thinking(answer_format: AnswerFormat) -> None:
    example = spec_of(answer_format).example
    assert extract_answer(THINK + example, answer_format)
    assert extract_answer(THINK + example + "\n" + example, answer_format) is None
    assert extract_answer(example, answer_format) is None
    assert extract_answer("<think>a</think><think>b</think>\n" + example, answer_format) is None


def test_catalogue_shape_and_extracted_answers() -> None:
    domains = Counter(spec.domain for spec in FORMAT_SPECS.values())
    assert len(FORMAT_SPECS) >= 150 and domains["math_only"] >= 15 and domains["code_only"] >= 5
    cases = {
        AnswerFormat.XML: "<answer>Paris</answer>", AnswerFormat.JSON: '{"answer": 42}',
        AnswerFormat.LATEX_BOXED: r"so \boxed{\frac{1}{2}}", AnswerFormat.TOML_SECTION: '[response]\nanswer = "B"',
        AnswerFormat.NATURAL_LANGUAGE_FINAL: "Working done.\nFinal answer: 12 apples",
        AnswerFormat.MARKDOWN_TABLE: "| Answer |\n|---|\n| Blue |", AnswerFormat.TRIPLE_ARROW_FORMAT: ">>> yes",
        AnswerFormat.COMPLEX_EVALUATION: "<CRITERIA>c</CRITERIA><ASSESSMENT>a</ASSESSMENT><SCORE>9</SCORE>"
                                         "<VERDICT>ship it</VERDICT>",
    }
    expected = ["Paris", "42", r"\frac{1}{2}", "B", "12 apples", "Blue", "yes", "ship it"]
    assert [extract_answer(THINK + text, fmt) for fmt, text in cases.items()] == expected
    wrong = {
        AnswerFormat.JSON: '{"answer": 42, "extra": 1}', AnswerFormat.DOUBLE_ARROW_FORMAT: ">>> yes",
        AnswerFormat.YAML_CONFIDENCE: "answer: x\nconfidence: 3", AnswerFormat.ANSWER_IS_FORMAT: "answer is: x",
        AnswerFormat.COMPLEX_EVALUATION: "<CRITERIA>c</CRITERIA><ASSESSMENT>a</ASSESSMENT><SCORE>high</SCORE>"
                                         "<VERDICT>v</VERDICT>",
        AnswerFormat.MULTIPLE_TAGS: "<answer>a</answer><theory>t</theory><explanation>e</explanation>",
    }
    assert all(extract_answer(THINK + text, fmt) is None for fmt, text in wrong.items())


def test_rows_become_items_as_the_hub_layouts_need() -> None:
    mcqa = json.loads((FIXTURES / "NousResearch__AcademicMCQA.jsonl").read_text().splitlines()[0])
    item = item_from_row(mcqa, {"name": "NousResearch/AcademicMCQA", "prompt_field": "prompt",
                                "answer_field": "ground_truth", "metadata_fields": ["answer", "options"]})
    assert item["answer"] == "B" and item["metadata"]["correct_answer_text"] == "Mercury"
    gsm8k = {"question": "q", "answer": "1000 + 200 = 1200\n#### 1,200"}
    assert item_from_row(gsm8k, {"name": "gsm8k", "prompt_field": "question", "answer_field": "answer"})["answer"] == "1200"
    chat = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    config = {"name": "chat", "prompt_field": "conversations", "answer_field": "conversations"}
    assert (item_from_row(chat, config)["prompt"], item_from_row(chat, config)["answer"]) == ("hi", "hello")
    assert item_from_row({"conversations": []}, config) is None


def test_process_scores_format_compliance(tmp_path: Path, tokenizer_dir: Path, tokenizer) -> None:
    with ScriptedInference(follows_half, tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.local_data_dir", str(FIXTURES),
                                "--env.seed", "11", steps=6, group_size=4)
    assert len(groups) == 6
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 0.0, 1.0, 1.0]
        for messages, score in zip(group["messages"], group["scores"]):
            reply, example = messages[-1]["content"], messages[0]["content"].split("Example:\n", 1)[1]
            assert (score == 1.0) == (reply.startswith(THINK) and reply.count(example) == 1)
    drawn = []
    for request in server.requests:
        spec = next(s for s in FORMAT_SPECS.values() if f"Answer format: {s.instruction}\n" in request["prompt"])
        drawn.append(spec)
        if spec.domain == "math_only":
            assert any(question in request["prompt"] for question in GSM8K_QUESTIONS)
        assert spec.domain != "code_only" and request["temperature"] == 0.9
    assert len({spec.value for spec in drawn}) > 1


def test_evaluate_reports_percent_correct(tmp_path: Path, tokenizer_dir: Path, tokenizer) -> None:
    with ScriptedInference(lambda prompt, i: THINK + example_in(prompt), tokenizer) as server:
        run_cli(SCRIPT, "evaluate", "--env.tokenizer_name", str(tokenizer_dir), "--env.use_wandb", "false",
                "--env.local_data_dir", str(FIXTURES), "--env.eval_set_percentage", "0.5", "--env.seed", "3",
                "--env.data_dir_to_save_evals", str(tmp_path / "eval"), "--openai.base_url", f"{server.url}/v1",
                "--openai.model_name", "scripted", "--openai.tokenizer_name", str(tokenizer_dir))
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert metrics == {"eval/percent_correct": 1.0}
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and all(s["correct"] and s["extracted_content"] for s in samples)
    assert all(r["temperature"] == 0.1 for r in server.requests)


def _env(tokenizer_dir: Path, **settings) -> AnswerFormatEnv:
    config = AnswerFormatEnvConfig(tokenizer_name=str(tokenizer_dir), group_size=4, use_wandb=False, seed=5,
                                   **settings)
    return AnswerFormatEnv(config, [APIServerConfig(model_name="m", base_url="http://127.0.0.1:9/v1")], slurm=False)


def test_equal_scores_drop_the_group_and_balance_rests_formats(tokenizer_dir: Path) -> None:
    env = _env(tokenizer_dir, ensure_equivalent_ratios=True, format_group_threshold=1,
               supported_formats="xml,json_array")
    item = {"selected_format": AnswerFormat.XML, "dataset_type": "generic"}
    prompt = [{"role": "user", "content": "What is the capital of France?"}]

    def rollouts(*answers: str) -> list:
        return [(prompt + [{"role": "assistant", "content": answer}], "stop") for answer in answers]

    right, wrong = THINK + "<answer>Paris</answer>", THINK + "Paris, without the tags."
    assert asyncio.run(env.score(rollouts(right, right, right, right), item)) is None
    assert asyncio.run(env.score(rollouts(wrong, wrong, wrong, wrong), item)) is None
    group = asyncio.run(env.score(rollouts(right, wrong, right, wrong), item))
    assert sorted(group["scores"]) == [0.0, 0.0, 1.0, 1.0]
    assert env.format_successful_groups == {"xml": 1}
    assert env._get_formats_for_dataset_type("generic") == [AnswerFormat.JSON_ARRAY]  # xml rests until json_array
    short = asyncio.run(env.score(rollouts(right, "ok", right, wrong), item))
    assert len(short["scores"]) == 3  # fewer than 10 trainable tokens: left out


def test_bad_dataset_configs_are_named(tokenizer_dir: Path) -> None:
    with pytest.raises(ValueError, match="dataset_type must be one of"):
        _env(tokenizer_dir, dataset_configs=[{"name": "x", "dataset_type": "poetry_only"}])
    with pytest.raises(ValueError, match="no 'name'"):
        _env(tokenizer_dir, dataset_configs=[{"split": "train"}])
