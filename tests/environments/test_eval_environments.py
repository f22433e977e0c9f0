"""environments/eval_environments: every evaluation environment runs ``evaluate`` offline on its
fixture against a scripted server answering some questions right and some wrong (and in
broken formats), and its metrics.json / samples.jsonl hold exactly the expected scores.
Also: eval_helpers' extraction and reasoning helpers, and IFEval's instruction checkers."""

from __future__ import annotations

import importlib
import json
import random
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest
from transformers import AutoTokenizer

from environments.eval_environments import eval_helpers as helpers
from environments.eval_environments.ifeval_instructions import instructions_registry
from tests.environments.harness import ENVIRONMENTS, run_cli
from tests.environments.scripted_inference import ScriptedInference

EVALS = ENVIRONMENTS / "eval_environments"
FIXTURES = ENVIRONMENTS / "fixtures"
THINK = "<think>Let me work through this, carefully, step by step.</think>\n"

# {substring of the user prompt: function(prompt) -> response}; filled by each test
SCRIPT: dict[str, Callable[[str], str]] = {}


def answer(prompt: str, index: int) -> str:
    for needle, respond in SCRIPT.items():
        if needle in prompt:
            return respond(prompt)
    raise KeyError(f"no scripted answer for a prompt ending {prompt[-300:]!r}")


@pytest.fixture(scope="module")
def server(tokenizer_dir: Path) -> Iterator[ScriptedInference]:
    with ScriptedInference(answer, AutoTokenizer.from_pretrained(str(tokenizer_dir))) as running:
        yield running


@pytest.fixture(autouse=True)
def _fresh_script() -> Iterator[None]:
    SCRIPT.clear()
    yield
    SCRIPT.clear()


def evaluate(script: str, fixture: str, server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path,
             *flags: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Run ``evaluate`` on the fixture; (metrics, samples, whole metrics.json)."""
    out = tmp_path / "evals"
    run_cli(EVALS / script, "evaluate", "--env.tokenizer_name", str(tokenizer_dir),
            "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted",
            "--env.test_file", str(FIXTURES / fixture), "--env.use_wandb", "false",
            "--env.data_dir_to_save_evals", str(out), "--env.retry_delay", "0", *flags)
    document = json.loads((out / "metrics.json").read_text())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return document["results"]["all"], samples, document


def rows(fixture: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / fixture).read_text().splitlines()]


def letter_of(prompt: str, text: str) -> str:
    """The letter the prompt shows `text` under (the asked question's list, after any examples)."""
    found = re.findall(r"^([A-J])\) " + re.escape(text.strip()) + r"$", prompt, re.MULTILINE)
    assert found, f"choice {text!r} not in the prompt"
    return found[-1]


def other_letter(letter: str) -> str:
    return "B" if letter == "A" else "A"


def user_messages(server: ScriptedInference, needle: str) -> list[list[dict[str, Any]]]:
    return [r["messages"] for r in server.requests if "messages" in r and needle in r["messages"][-1]["content"]]


# -- math ------------------------------------------------------------------------------------------


def test_gsm8k_scores_boxed_answers(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        "7 trays": lambda p: THINK + "Therefore, the final answer is: $\\boxed{75}$. I hope it is correct",
        "Tomas saves": lambda p: "No thinking block. Therefore, the final answer is: $\\boxed{83}$.",
        "3 boxes of 450": lambda p: THINK + "1350 + 550 gives \\boxed{1,900}",
        "6 rows of 9": lambda p: THINK + "Either \\boxed{36} or \\boxed{35}.",
    })
    metrics, samples, document = evaluate("gsm8k_eval.py", "gsm8k_eval/test.jsonl", server, tokenizer_dir, tmp_path)
    # right, right (but no think block: format broken), right (thousands separator), two boxed answers: wrong
    assert metrics["gsm8k/accuracy"] == 0.75 and metrics["gsm8k/total_evaluated"] == 4
    assert metrics["gsm8k/format_compliance_rate"] == 0.75
    assert metrics["gsm8k/multiple_boxed_rate"] == 0.25 and metrics["gsm8k/has_boxed_rate"] == 0.75
    assert metrics["config/thinking_mode"] == 1.0 and metrics["config/eval_max_tokens"] == 0
    by_gold = {s["gold_answer"]: s for s in samples}
    assert by_gold["1900"]["is_correct"] and by_gold["1900"]["extracted_answer"] == "1,900"
    assert not by_gold["36"]["is_correct"] and by_gold["36"]["has_multiple_boxed"]
    assert by_gold["83"]["is_correct"] and not by_gold["83"]["format_valid"]
    assert set(document["results"]) == {"atropos|gsm8k_eval_eval|0", "all"}
    assert document["config_general"]["model_name"] == "scripted"
    # thinking mode asks the API for reasoning; no system prompt unless one is configured
    request = next(r for r in server.requests if "7 trays" in r["messages"][-1]["content"])
    assert request["reasoning"] == {"enabled": True} and [m["role"] for m in request["messages"]] == ["user"]
    assert "\\boxed{ANSWER}" in request["messages"][0]["content"]


def test_math500_in_process_verification_and_groups(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        "Simplify": lambda p: "Dividing by 6 gives $\\boxed{\\dfrac{3}{4}}$.",
        "x^2 = 49": lambda p: "So x = \\boxed{7}.",
        "sqrt{2}": lambda p: "The product is \\boxed{4}.",  # gold taken from the solution's box
        "divisors does 12": lambda p: "I count \\boxed{5}.",
    })
    metrics, samples, _ = evaluate("math500_eval.py", "math500_eval/test.jsonl", server, tokenizer_dir, tmp_path,
                                   "--env.thinking_mode", "false", "--env.max_math_workers", "0",
                                   "--env.custom_system_prompt", "You are a precise mathematician.")
    assert metrics["math500/accuracy"] == 0.75
    assert metrics["math500/subject_algebra_accuracy"] == 1.0 and metrics["math500/subject_number_theory_accuracy"] == 0.0
    assert metrics["math500/level_1_accuracy"] == 1.0 and metrics["math500/level_2_accuracy"] == 0.5
    assert metrics["math500/format_compliance_rate"] == 1.0 and "math500/thinking_utilization_rate" not in metrics
    assert metrics["config/thinking_mode"] == 0.0
    assert {s["gold_answer"] for s in samples} == {"\\frac{3}{4}", "7", "4", "6"}
    request = next(r for r in server.requests if "Simplify" in r["messages"][-1]["content"])
    assert request["messages"][0] == {"role": "system", "content": "You are a precise mathematician."}
    assert "reasoning" not in request


def test_aime_years_and_integer_answers(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        "7^{4}": lambda p: THINK + "Therefore, the final answer is: $\\boxed{401}$. I hope it is correct",
        "a+b=20": lambda p: THINK + "Therefore, the final answer is: $\\boxed{019}$. I hope it is correct",
        "divisors of $28$": lambda p: THINK + "Therefore, the final answer is: $\\boxed{27}$. I hope it is correct",
    })
    metrics, samples, _ = evaluate("aime_eval.py", "aime_eval/test.jsonl", server, tokenizer_dir, tmp_path,
                                   "--env.max_math_workers", "0", "--env.years", "2024,2025")
    assert metrics["aime/accuracy"] == pytest.approx(2 / 3)
    assert metrics["aime/accuracy_2024"] == 1.0 and metrics["aime/accuracy_2025"] == 0.0
    assert {s["item_id"]: s["extracted_int"] for s in samples} == {"aime2024_0": 401, "aime2024_1": 19, "aime2025_2": 27}


# -- multiple choice -------------------------------------------------------------------------------


def test_mmlu_few_shot_letters_choice_text_and_fallbacks(server: ScriptedInference, tokenizer_dir: Path,
                                                         tmp_path: Path) -> None:
    items = {row["question"]: row for row in rows("mmlu_eval/test.jsonl")}

    def right(question: str) -> Callable[[str], str]:
        row = items[question]
        return lambda p: THINK + f"<answer>{letter_of(p, row['choices'][row['answer']])}</answer>"

    SCRIPT.update({
        "protects the brain": right("Which bone protects the brain?"),
        "chambers does the human heart": lambda p: THINK + "<answer>A</answer>",  # wrong
        "closest to the Sun": lambda p: THINK + "<answer>Mercury</answer>",  # the choice's text
        "7 multiplied by 8": lambda p: THINK + "After checking, the answer is B",  # no tag: fallback
        "studies knowledge": lambda p: THINK + "Definitely.",  # no tag, no pattern: the last valid letter, D
        "central bank": lambda p: "<think>one</think><think>two</think><answer>A</answer>",  # right, format broken
    })
    metrics, samples, _ = evaluate("mmlu_eval.py", "mmlu_eval/test.jsonl", server, tokenizer_dir, tmp_path,
                                   "--env.few_shot_file", str(FIXTURES / "mmlu_eval/dev.jsonl"), "--env.num_few_shot", "2")
    assert metrics["mmlu/accuracy"] == pytest.approx(5 / 6) and metrics["mmlu/total_correct"] == 5
    assert metrics["mmlu/subject_anatomy_accuracy"] == 0.5 and metrics["mmlu/subject_astronomy_accuracy"] == 1.0
    assert metrics["mmlu/category_stem_accuracy"] == 0.75 and metrics["mmlu/category_humanities_accuracy"] == 1.0
    assert metrics["mmlu/category_social_sciences_accuracy"] == 1.0
    assert metrics["mmlu/format_compliance_rate"] == pytest.approx(5 / 6)
    assert metrics["mmlu/answer_tag_rate"] == pytest.approx(4 / 6)
    assert metrics["config/num_few_shot"] == 2
    method = {s["question"]: s["extraction_method"] for s in samples}
    assert method["Which planet is closest to the Sun?"] == "answer_tag_choice_match"
    assert method["What is 7 multiplied by 8?"] == "fallback_the_answer_is"
    assert method["Which branch of philosophy studies knowledge?"] == "fallback_last_valid_letter"
    # two solved examples of the same subject precede the question
    prompt = user_messages(server, "protects the brain")[0][-1]["content"]
    assert "Which organ pumps blood?" in prompt and "Which muscle lets us breathe in?" in prompt
    assert "Answer: B" in prompt and "largest planet" not in prompt
    assert prompt.rstrip().endswith("D) Tibia")


def test_mmlu_subject_filter(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({"protects the brain": lambda p: "<answer>B</answer>", "human heart": lambda p: "<answer>C</answer>"})
    metrics, samples, _ = evaluate("mmlu_eval.py", "mmlu_eval/test.jsonl", server, tokenizer_dir, tmp_path,
                                   "--env.subjects", "anatomy", "--env.thinking_mode", "false")
    assert metrics["mmlu/accuracy"] == 1.0 and metrics["mmlu/total_evaluated"] == 2
    assert {s["subject"] for s in samples} == {"anatomy"}


def test_mmlu_pro_ten_choices(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        "plants absorb": lambda p: THINK + "<answer>C</answer>",
        "derivative of x^2": lambda p: THINK + "<answer>(J)</answer>",  # wrong, a valid tenth letter
        "first-in, first-out": lambda p: THINK + "The final answer is (B). I hope it is correct",
        "unit of force": lambda p: THINK + "<answer>The answer is D</answer>",
    })
    metrics, samples, _ = evaluate("mmlu_pro_eval.py", "mmlu_pro_eval/test.jsonl", server, tokenizer_dir, tmp_path,
                                   "--env.few_shot_file", str(FIXTURES / "mmlu_pro_eval/validation.jsonl"),
                                   "--env.num_few_shot", "1")
    assert metrics["mmlu_pro/accuracy"] == 0.75
    assert metrics["mmlu_pro/category_math_accuracy"] == 0.0 and metrics["mmlu_pro/category_computer_science_accuracy"] == 1.0
    assert {s["extracted_answer"] for s in samples} == {"C", "J", "B", "D"}
    prompt = user_messages(server, "plants absorb")[0][-1]["content"]
    assert "A, B, C, D, E, F, G, H, I or J" in prompt and "Which organelle makes ATP?" in prompt


def test_mmlu_pro_category_filter(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({"unit of force": lambda p: "<answer>D</answer>"})
    metrics, _, _ = evaluate("mmlu_pro_eval.py", "mmlu_pro_eval/test.jsonl", server, tokenizer_dir, tmp_path,
                             "--env.categories", '["physics"]', "--env.thinking_mode", "false")
    assert metrics["mmlu_pro/total_evaluated"] == 1 and metrics["mmlu_pro/accuracy"] == 1.0


def test_arc_numeric_labels_become_letters(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        "source of light": lambda p: THINK + "<answer>B</answer>",
        "when it freezes": lambda p: THINK + f"<answer>{letter_of(p, 'It becomes a solid')}</answer>",
        "measures temperature": lambda p: THINK + "<answer>A</answer>",  # wrong
        "roots take up": lambda p: THINK + "<answer>A) Water</answer>",
    })
    metrics, samples, _ = evaluate("arc_eval.py", "arc_eval/test.jsonl", server, tokenizer_dir, tmp_path)
    assert metrics["arc/accuracy"] == 0.75
    assert {s["item_id"]: s["gold_answer"] for s in samples} == {"Fixture_1": "B", "Fixture_2": "B", "Fixture_3": "C",
                                                                  "Fixture_4": "A"}
    assert metrics["config/subset"] == "ARC-Challenge"


def test_hellaswag_skips_unlabeled_rows(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        "Making tea": lambda p: THINK + "<answer>A</answer>",
        "Riding a bike": lambda p: THINK + "<answer>C</answer>",  # wrong
        "Washing dishes": lambda p: THINK + "<answer>C</answer>",
    })
    metrics, samples, _ = evaluate("hellaswag_eval.py", "hellaswag_eval/validation.jsonl", server, tokenizer_dir, tmp_path)
    assert metrics["hellaswag/total_evaluated"] == 3 and metrics["hellaswag/accuracy"] == pytest.approx(2 / 3)
    prompt = user_messages(server, "Making tea")[0][-1]["content"]
    assert "Making tea: A man fills a kettle with water and switches it on. When it boils, he" in prompt


def test_boolq_yes_no_words_and_letters(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        "blue whale": lambda p: THINK + "<answer>Yes</answer>",
        "penguins fly": lambda p: THINK + "<answer>B</answer>",
        "mount everest": lambda p: THINK + "Having read it: no, it is not.",  # wrong, read without tags
        "atlantic": lambda p: THINK + "<answer>A</answer>",  # wrong (gold False -> No)
    })
    metrics, samples, _ = evaluate("boolq_eval.py", "boolq_eval/validation.jsonl", server, tokenizer_dir, tmp_path)
    assert metrics["boolq/accuracy"] == 0.5
    assert metrics["boolq/yes_accuracy"] == 0.5 and metrics["boolq/no_accuracy"] == 0.5
    assert {s["extraction_method"] for s in samples} == {"answer_tag_yes", "answer_tag", "fallback_no_keyword"}
    prompt = user_messages(server, "blue whale")[0][-1]["content"]
    assert "is the blue whale the largest animal?\n" in prompt and "A) Yes\nB) No" in prompt


def test_winogrande_two_options(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        "trophy would not fit": lambda p: THINK + "<answer>A</answer>",
        "poured water": lambda p: THINK + "<answer>cup</answer>",
        "lent her umbrella": lambda p: THINK + "<answer>A</answer>",  # wrong
    })
    metrics, _, _ = evaluate("winogrande_eval.py", "winogrande_eval/validation.jsonl", server, tokenizer_dir, tmp_path)
    assert metrics["winogrande/total_evaluated"] == 3 and metrics["winogrande/accuracy"] == pytest.approx(2 / 3)


def test_gpqa_seeded_answer_positions(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    data = {row["Question"]: row for row in rows("gpqa_eval/train.jsonl")}

    def respond(question: str, right: bool) -> Callable[[str], str]:
        def reply(prompt: str) -> str:
            letter = letter_of(prompt, data[question]["Correct Answer"])
            return THINK + f"<answer>{letter if right else other_letter(letter)}</answer>"
        return reply

    questions = list(data)
    SCRIPT.update({q: respond(q, right=i != 1) for i, q in enumerate(questions)})
    metrics, samples, _ = evaluate("gpqa_eval.py", "gpqa_eval/train.jsonl", server, tokenizer_dir, tmp_path)
    assert metrics["gpqa/accuracy"] == 0.75 and metrics["gpqa/subdomain_molecular_biology_accuracy"] == 0.0
    draw = random.Random(42)
    assert [s["gold_answer"] for s in samples] == ["ABCD"[draw.randint(0, 3)] for _ in questions]


# -- ifeval and simpleqa ---------------------------------------------------------------------------


def test_ifeval_strict_and_loose(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        # the think block's commas are not checked; the trailing line breaks the strict end check only
        "note about autumn": lambda p: "<think>Hmm, commas, here.</think>Leaves fall softly. Any other questions?\n*Hope this helps*",
        "three fruits": lambda p: THINK + "<<Fruits>>\n* apple\n* pear\n* plum",
        "Describe a river": lambda p: THINK + "The river runs over stone and the current carries leaves down to the quiet sea below.",
        "Reply in JSON": lambda p: THINK + '```json\n{"city": "Paris", "country": "France"}\n```',
    })
    metrics, samples, _ = evaluate("ifeval_eval.py", "ifeval_eval/train.jsonl", server, tokenizer_dir, tmp_path)
    assert metrics["ifeval/prompt_level_strict_acc"] == 0.5 and metrics["ifeval/accuracy"] == 0.5
    assert metrics["ifeval/prompt_level_loose_acc"] == 0.75
    assert metrics["ifeval/inst_level_strict_acc"] == 0.75 and metrics["ifeval/inst_level_loose_acc"] == 0.875
    assert metrics["ifeval/total_instructions"] == 8
    river = next(s for s in samples if s["prompt"].startswith("Describe a river"))
    assert river["inst_level_strict"] == [False, True, True]
    assert user_messages(server, "three fruits")[0][-1]["content"] == rows("ifeval_eval/train.jsonl")[1]["prompt"]


def test_simpleqa_string_matching(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path) -> None:
    SCRIPT.update({
        "capital city of Australia": lambda p: THINK + "<answer>Canberra</answer>",
        "laws of motion": lambda p: THINK + "<answer>Sir Isaac Newton</answer>",  # fuzzy: contains the gold
        "seven-continent": lambda p: THINK + "<answer>Six</answer>",
        "Starry Night": lambda p: THINK + "Vincent van Gogh painted it.",  # no tag: the text is used
    })
    metrics, _, _ = evaluate("simpleqa_eval.py", "simpleqa_eval/test.jsonl", server, tokenizer_dir, tmp_path)
    assert metrics["simpleqa/accuracy"] == 0.75
    assert metrics["simpleqa/exact_match_accuracy"] == 0.25 and metrics["simpleqa/fuzzy_match_accuracy"] == 0.75
    assert metrics["simpleqa/answer_tag_rate"] == 0.75
    assert metrics["simpleqa/topic_geography_accuracy"] == 0.5 and metrics["simpleqa/topic_art_accuracy"] == 1.0
    assert metrics["config/use_llm_judge"] == 0.0


def test_simpleqa_llm_judge(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    grades = {"Canberra": "A", "Newton": "CORRECT", "Six": "B", "I am not sure": "C"}
    SCRIPT.update({
        "Reference answer": lambda p: grades[p.split("Model's answer: ")[1].split("\n")[0]],
        "capital city of Australia": lambda p: THINK + "<answer>Canberra</answer>",
        "laws of motion": lambda p: THINK + "<answer>Newton</answer>",
        "seven-continent": lambda p: THINK + "<answer>Six</answer>",
        "Starry Night": lambda p: THINK + "<answer>I am not sure</answer>",
    })
    monkeypatch.setenv("H8_JUDGE_KEY", "secret")
    metrics, samples, _ = evaluate("simpleqa_eval.py", "simpleqa_eval/test.jsonl", server, tokenizer_dir, tmp_path,
                                   "--env.use_llm_judge", "true", "--env.judge_base_url", f"{server.url}/v1",
                                   "--env.judge_api_key_env", "H8_JUDGE_KEY", "--env.judge_model_name", "judge")
    assert metrics["simpleqa/accuracy"] == 0.5 and metrics["simpleqa/accuracy_if_attempted"] == pytest.approx(2 / 3)
    assert metrics["simpleqa/not_attempted_rate"] == 0.25 and metrics["simpleqa/incorrect_count"] == 1
    assert {s["grade"] for s in samples} == {"CORRECT", "INCORRECT", "NOT_ATTEMPTED"}
    judged = [r for r in server.requests if r.get("model") == "judge"]
    assert len(judged) == 4 and all(r["temperature"] == 0.0 for r in judged)


def test_simpleqa_judge_needs_its_key(server: ScriptedInference, tokenizer_dir: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("H8_MISSING_KEY", raising=False)
    with pytest.raises(ValueError, match="H8_MISSING_KEY"):
        evaluate("simpleqa_eval.py", "simpleqa_eval/test.jsonl", server, tokenizer_dir, tmp_path,
                 "--env.use_llm_judge", "true", "--env.judge_api_key_env", "H8_MISSING_KEY")


# -- hub loading and defaults, as Atropos -------------------------------------------------------


def env_module(stem: str) -> Any:
    """An environment file's module, imported the way its command line imports it (siblings by bare name)."""
    saved = sys.path[:]
    sys.path.insert(0, str(EVALS))
    try:
        return importlib.import_module(stem)
    finally:
        sys.path[:] = saved


# (file stem, class, hub calls (dataset, configuration, split) made by build_items with the defaults)
HUB = [
    ("gsm8k_eval", "GSM8KEvalEnv", [("openai/gsm8k", "main", "test")]),
    ("math500_eval", "MATH500EvalEnv", [("HuggingFaceH4/MATH-500", None, "test")]),
    ("mmlu_pro_eval", "MMLUProEvalEnv", [("TIGER-Lab/MMLU-Pro", None, "test")]),
    ("arc_eval", "ARCEvalEnv", [("allenai/ai2_arc", "ARC-Challenge", "test")]),
    ("hellaswag_eval", "HellaSwagEvalEnv", [("Rowan/hellaswag", None, "validation")]),
    ("boolq_eval", "BoolQEvalEnv", [("lighteval/boolq_helm", None, "validation")]),
    ("winogrande_eval", "WinoGrandeEvalEnv", [("allenai/winogrande", "winogrande_xl", "validation")]),
    ("gpqa_eval", "GPQAEvalEnv", [("Idavidrein/gpqa", "gpqa_diamond", "train")]),
    ("ifeval_eval", "IFEvalEnv", [("google/IFEval", None, "train")]),
    ("simpleqa_eval", "SimpleQAEvalEnv", [("lighteval/SimpleQA", None, "test")]),
]
FIXTURE_OF = {"gsm8k_eval": "gsm8k_eval/test.jsonl", "math500_eval": "math500_eval/test.jsonl",
              "mmlu_eval": "mmlu_eval/test.jsonl", "mmlu_pro_eval": "mmlu_pro_eval/test.jsonl",
              "arc_eval": "arc_eval/test.jsonl", "hellaswag_eval": "hellaswag_eval/validation.jsonl",
              "boolq_eval": "boolq_eval/validation.jsonl", "winogrande_eval": "winogrande_eval/validation.jsonl",
              "gpqa_eval": "gpqa_eval/train.jsonl", "ifeval_eval": "ifeval_eval/train.jsonl",
              "simpleqa_eval": "simpleqa_eval/test.jsonl"}


def unbuilt(module: Any, class_name: str, **config: Any) -> Any:
    """The environment with its config_init() settings (plus `config`), without a tokenizer or servers."""
    env_cls = getattr(module, class_name)
    env = env_cls.__new__(env_cls)
    defaults, _ = env_cls.config_init()
    env.config = type(defaults)(**{**defaults.model_dump(), **config})
    return env


def record_hub(monkeypatch: pytest.MonkeyPatch, stem: str) -> list[tuple]:
    calls: list[tuple] = []

    def fake_load_rows(hub: str, config: Any = None, split: str = "train", local_file: Any = None) -> list[dict]:
        assert not local_file
        calls.append((hub, config, split))
        data = rows(FIXTURE_OF[stem])
        return [{**row, "subject": config} for row in data[:1]] if stem == "mmlu_eval" else data

    monkeypatch.setattr(env_module("eval_common"), "load_rows", fake_load_rows)
    return calls


@pytest.mark.parametrize("stem,class_name,expected", HUB, ids=[h[0] for h in HUB])
def test_hub_datasets_as_atropos(monkeypatch: pytest.MonkeyPatch, stem: str, class_name: str, expected: list) -> None:
    calls = record_hub(monkeypatch, stem)
    items = unbuilt(env_module(stem), class_name).build_items()
    assert calls == expected and items


def test_mmlu_hub_loads_every_subject_and_its_dev_split(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = record_hub(monkeypatch, "mmlu_eval")
    module = env_module("mmlu_eval")
    env = unbuilt(module, "MMLUEvalEnv", num_few_shot=1)
    items = env.build_items()
    assert len(module.MMLU_SUBJECTS) == 57 and len(items) == 57
    assert calls == [("lighteval/mmlu", s, "dev") for s in module.MMLU_SUBJECTS] + [
        ("lighteval/mmlu", s, "test") for s in module.MMLU_SUBJECTS]
    assert env.few_shot_examples(items[0])[0]["subject"] == items[0]["subject"]


def test_aime_hub_years(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    loaded: list[str] = []

    def fake_load_dataset(name: str, *args: Any, **kwargs: Any) -> dict:
        loaded.append(name)
        return {"train": [{"problem": f"{name} problem", "answer": "5"}]}

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    items = unbuilt(env_module("aime_eval"), "AIMEEvalEnv").build_items()
    assert loaded == ["HuggingFaceH4/aime_2024", "yentinglin/aime_2025"]
    assert sorted(item["year"] for item in items) == ["2024", "2025"]


NAMES = {"gsm8k_eval": "GSM8KEvalEnv", "math500_eval": "MATH500EvalEnv", "aime_eval": "AIMEEvalEnv",
         "mmlu_eval": "MMLUEvalEnv", "mmlu_pro_eval": "MMLUProEvalEnv", "arc_eval": "ARCEvalEnv",
         "hellaswag_eval": "HellaSwagEvalEnv", "boolq_eval": "BoolQEvalEnv", "winogrande_eval": "WinoGrandeEvalEnv",
         "gpqa_eval": "GPQAEvalEnv", "ifeval_eval": "IFEvalEnv", "simpleqa_eval": "SimpleQAEvalEnv"}


@pytest.mark.parametrize("stem", sorted(NAMES))
def test_names_and_config_init_defaults(stem: str) -> None:
    env_cls = getattr(env_module(stem), NAMES[stem])
    config, servers = env_cls.config_init()
    assert env_cls.name == stem and isinstance(config, env_cls.env_config_cls)
    assert config.thinking_mode is True and config.custom_thinking_prompt is None and config.eval_max_tokens == 0
    assert config.eval_temperature == 0.6 and config.group_size == 1 and config.total_steps == 1
    assert config.wandb_name == stem and config.test_file is None
    port = "8000" if stem in {"arc_eval", "hellaswag_eval", "boolq_eval", "winogrande_eval"} else "9000"
    assert [s.base_url for s in servers] == [f"http://localhost:{port}/v1"]
    assert servers[0].model_name == "Hermes-3-Llama-3.1-8B"


# -- eval_helpers ---------------------------------------------------------------------------------


def test_letter_extraction_from_answer_tags() -> None:
    valid = {"A", "B", "C", "D"}
    cases = {
        "<answer>B</answer>": ("B", "answer_tag"), "<answer>(c).</answer>": ("C", "answer_tag"),
        "<answer>Final Answer: D</answer>": ("D", "answer_tag"), "<answer>The answer is A</answer>": ("A", "answer_tag"),
        "<answer>A is better than B</answer>": (None, "answer_tag_ambiguous"),
        "<answer></answer>": (None, "empty_answer_tag"), "B": (None, "no_answer_tag"),
        "<answer>maybe</answer>": (None, "answer_tag_no_letter"),
        "<answer>C) Tom Holland</answer>": ("C", "answer_tag"),
    }
    for text, expected in cases.items():
        assert helpers.extract_letter_from_answer_tag(text, valid) == expected, text
    choices = ["Zendaya", "Tom Holland", "Jacob Batalon", "Marisa Tomei"]
    assert helpers.extract_letter_from_answer_tag("<answer>tom  holland</answer>", valid, choices=choices) == (
        "B", "answer_tag_choice_match")
    assert helpers.extract_number_from_answer_tag("<answer>Option 3</answer>", 5) == (3, "answer_tag")
    assert helpers.extract_number_from_answer_tag("<answer>1 or 2</answer>", 5) == (None, "answer_tag_ambiguous")
    assert helpers.extract_freeform_from_answer_tag("x <answer> Paris </answer>") == ("Paris", "answer_tag")


def test_mcqa_fallbacks() -> None:
    assert helpers.extract_mcqa_answer_with_fallback("The final answer is (B). I hope it is correct") == (
        "B", "fallback_final_answer_hope")
    assert helpers.extract_mcqa_answer_with_fallback("Answer: C", 4) == ("C", "fallback_answer_colon")
    assert helpers.extract_mcqa_answer_with_fallback("D. because", 4) == ("D", "fallback_start")
    assert helpers.extract_mcqa_answer_with_fallback("", 4) == (None, "empty_response")
    assert helpers.extract_mcqa_answer_with_fallback("xyz", 4) == (None, "no_match")
    assert helpers.extract_mcqa_answer_with_fallback("ZZD", 4, last_resort=False) == (None, "no_match")
    assert helpers.extract_mcqa_answer_with_fallback("ZZD", 4) == ("D", "fallback_last_valid_letter")
    assert [name for _, _, name in helpers.build_mcqa_fallback_patterns(2)][0] == "final_answer_hope"


def test_thinking_helpers_and_prompts() -> None:
    assert helpers.validate_thinking_format("<think>a</think> B", True) == (True, "B")
    assert helpers.validate_thinking_format("<think>a</think><think>b</think> B", True)[0] is False
    assert helpers.validate_thinking_format("no tags", True) == (False, "no tags")
    assert helpers.validate_thinking_format("no tags", False) == (True, "no tags")
    assert helpers.extract_thinking_content("x<think> idea </think>y") == "idea"
    assert helpers.get_default_thinking_prompt() is None
    assert helpers.get_thinking_prompt_or_hermes() == helpers.HERMES_REASONING_PROMPT
    assert helpers.create_system_content(True) is None
    assert helpers.create_system_content(True, "think", "be brief") == "think\n\nbe brief"
    assert helpers.create_system_content(False, "think", "be brief") == "be brief"
    assert "<think>" in helpers.HERMES_REASONING_PROMPT and "</think>" in helpers.HERMES_REASONING_PROMPT
    assert "<answer>" in helpers.HERMES_REASONING_PROMPT_WITH_ANSWER


def test_reasoning_extraction_from_api_shapes() -> None:
    message = SimpleNamespace(content="<think>inner</think>4", reasoning_content=None, reasoning="api thoughts")
    completion = SimpleNamespace(choices=[SimpleNamespace(message=message)], model="m",
                                 usage=SimpleNamespace(prompt_tokens=5, completion_tokens=10, total_tokens=15,
                                                       completion_tokens_details=SimpleNamespace(reasoning_tokens=4)))
    assert helpers.extract_reasoning_from_completion(completion) == ("api thoughts", "reasoning", "<think>inner</think>4")
    details = {"message": {"content": "x", "reasoning_details": [{"type": "reasoning.text", "text": "step"}]}}
    assert helpers.extract_reasoning_from_response(details) == ("step", "reasoning_details")
    assert helpers.extract_reasoning_from_response(SimpleNamespace(), "<think>t</think>") == ("t", "think_block")
    assert helpers.extract_reasoning_from_completion(SimpleNamespace(choices=[])) == (None, "none", None)
    usage = helpers.get_reasoning_token_usage(completion)
    assert usage["reasoning_tokens"] == 4 and usage["has_reasoning_content"] and usage["total_tokens"] == 15
    assert "reasoning tokens: 4" in helpers.format_reasoning_debug_info(completion)


def test_math_helpers(tmp_path: Path) -> None:
    assert helpers.extract_boxed_answers("\\boxed{\\frac{\\sqrt{2}}{2}} and \\boxed {3}") == ["\\frac{\\sqrt{2}}{2}", "3"]
    assert helpers.extract_first_boxed_answer("<think>\\boxed{1}</think> \\boxed{2}") == ("2", "boxed", False)
    assert helpers.extract_first_boxed_answer("\\boxed{1} \\boxed{2}", after_think=False) == (None, "multiple_boxed", True)
    assert helpers.math_normalize_string("$\\text{10}\\,$.") == "10"
    assert helpers.compare_math_strings("1,000", "1000") and helpers.compare_math_strings("0.5000001", "0.5")
    assert not helpers.compare_math_strings("", "1")
    assert helpers.score_math_answer("\\frac{1}{2}", "so \\boxed{0.5}") == (True, "math_verify", False)
    assert helpers.score_math_answer("3", "no box") == (None, "no_boxed", False)
    assert helpers.score_math_answer("3", "\\boxed{4}")[0] is False
    saved = helpers.save_eval_results(str(tmp_path), {"accuracy": 0.5}, [{"is_correct": True}, {"is_correct": False}],
                                      print_confirmation=False)
    metrics, results = helpers.load_eval_results(str(tmp_path))
    assert Path(saved[0]).name == "metrics.json" and metrics == {"accuracy": 0.5}
    assert helpers.calculate_accuracy(results) == 0.5 and helpers.format_percentage(0.755) == "75.50%"
    assert list(helpers.group_results_by_key([{"k": 1}, {"k": 2}, {}], "k")) == [1, 2, "unknown"]


# -- IFEval instruction checkers -------------------------------------------------------------------

# (instruction id, kwargs, a response that follows it, one that does not)
CHECKS = [
    ("keywords:existence", {"keywords": ["tea", "cup"]}, "A Cup of TEA.", "A cup of coffee."),
    ("keywords:frequency", {"keyword": "sun", "frequency": 2, "relation": "at least"}, "sun and sun", "one sun"),
    ("keywords:frequency", {"keyword": "sun", "frequency": 2, "relation": "less than"}, "one sun", "sun, sun"),
    ("keywords:forbidden_words", {"forbidden_words": ["red"]}, "a reddish hue", "a Red hue"),
    ("keywords:letter_frequency", {"letter": "Z", "let_frequency": 2, "let_relation": "at least"}, "zZ", "z"),
    ("language:response_language", {"language": "de"},
     "Das ist ein kurzer Satz auf Deutsch, und er handelt von einem Hund im Garten.",
     "This is a short sentence in English about a dog playing in the garden."),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"},
     "Dr. Smith came. He left.", "One. Two. Three."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "first part\n***\nsecond part", "a\n***\n\n***\nb"),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four five", "one two"),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "First here.\n\n\"Then, there.", "First here.\n\nAfter that."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "[name] at [address]", "[name] only"),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\nP.S. bye", "Hi. PS bye"),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\np.p.s later", "Hi."),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n- two", "* one\n* two\n* three"),
    ("detectable_format:constrained_response", {}, "Thinking... My answer is maybe.", "Maybe."),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", "*one* and * *"),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nintro\nSection 2\nend", "Section 1\nonly"),
    ("detectable_format:json_format", {}, '```JSON\n{"a": 1}\n```', "{'a': 1}"),
    ("detectable_format:title", {}, "<<My Poem>>\ntext", "<<>> text"),
    ("combination:two_responses", {}, "first******second", "same******same"),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "say hi. Hi!", "Hi! Say hi."),
    ("startend:end_checker", {"end_phrase": "Is there anything else?"}, '"Done. Is there anything else?"', "Is there anything else? Done."),
    ("startend:quotation", {}, ' "quoted" ', '"half'),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"}, "NASA and ESA", "Only NASA"),
    ("change_case:english_capital", {}, "THIS IS AN ENGLISH SENTENCE ABOUT THE WEATHER TODAY.", "This is mixed case."),
    ("change_case:english_lowercase", {}, "this is an english sentence about the weather today.", "This has a capital."),
    ("punctuation:no_comma", {}, "no commas here", "one, two"),
]


def test_ifeval_registry_covers_the_benchmark() -> None:
    assert len(instructions_registry.INSTRUCTION_DICT) == 25
    assert {check[0] for check in CHECKS} == set(instructions_registry.INSTRUCTION_DICT)


@pytest.mark.parametrize("instruction_id,kwargs,good,bad", CHECKS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CHECKS)])
def test_ifeval_checker(instruction_id: str, kwargs: dict[str, Any], good: str, bad: str) -> None:
    checker = instructions_registry.INSTRUCTION_DICT[instruction_id](instruction_id)
    description = checker.build_description(**{**kwargs, "unused_key": None})
    assert isinstance(description, str) and description
    assert checker.check_following(good), good
    assert not checker.check_following(bad), bad
