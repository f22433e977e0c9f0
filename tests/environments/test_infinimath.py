"""infinimath: scoring (correctness plus the think and boxed bonuses), the curriculum moving up,
optional word-problem rewriting by a second model, evaluation, and the answer helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

mathgenerator = pytest.importorskip("mathgenerator", reason="infinimath needs `pip install mathgenerator`")

from environments.infinimath.curriculum import MathCurriculum  # noqa: E402
from environments.infinimath.infinimath import InfiniteMath, answers_match, extract_boxed  # noqa: E402
from tests.environments.harness import process_groups, run_cli  # noqa: E402
from tests.environments.scripted_inference import ScriptedInference  # noqa: E402

SCRIPT = "infinimath/infinimath_env.py"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture
def generated(monkeypatch) -> dict[str, tuple[str, int]]:
    """Every problem mathgenerator deals during the test: problem text (``$`` removed) ->
    (solution, generator id), so that scripted answers can be right or wrong on purpose."""
    from environments.infinimath.infinimath import strip_latex_delimiters

    seen: dict[str, tuple[str, int]] = {}
    real = mathgenerator.genById

    def recording(generator_id, *args, **kwargs):
        problem, solution = real(generator_id, *args, **kwargs)
        seen[strip_latex_delimiters(problem).strip()] = (strip_latex_delimiters(solution), generator_id)
        return problem, solution

    monkeypatch.setattr(mathgenerator, "genById", recording)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return seen


def lookup(generated: dict[str, tuple[str, int]], prompt: str) -> tuple[str, str, int]:
    """(problem, solution, generator id) of the generated problem the prompt asks."""
    matches = [problem for problem in generated if problem and problem in prompt]
    problem = max(matches, key=len)
    return (problem, *generated[problem])


REPLIES = {
    "right": lambda s: f"I work it out.\n</think>\n\n\\boxed{{{s}}}",                 # 1 + 0.2 + 0.2
    "wrong": lambda s: "I work it out.\n</think>\n\n\\boxed{nonsense}",               # -0.5 + 0.2 + 0.2
    "right_unboxed": lambda s: f"I work it out.\n</think>\n\n{s}",                      # 1 + 0.2
    "right_no_thinking": lambda s: f"</think>\n\\boxed{{{s}}}",                         # 1 + 0.2
}
EXPECTED = {"right": 1.4, "wrong": -0.1, "right_unboxed": 1.2, "right_no_thinking": 1.2}
ORDER = ["right", "wrong", "right_unboxed", "right_no_thinking"]


def test_scores_correctness_think_and_boxed(tmp_path, tokenizer_dir, tokenizer, generated):
    def answer(prompt: str, index: int) -> str:
        return REPLIES[ORDER[index % 4]](lookup(generated, prompt)[1])

    with ScriptedInference(answer, tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, steps=3, group_size=4)
    assert len(groups) == 3
    for group in groups:
        kinds = []
        for messages in group["messages"]:
            solution = lookup(generated, messages[1]["content"])[1]
            reply = messages[-1]["content"]
            assert reply.startswith("<think>\n")  # the pre-filled opening tag is part of the reply
            kinds.append(next(kind for kind in ORDER if "<think>\n" + REPLIES[kind](solution) == reply))
        assert group["scores"] == pytest.approx([EXPECTED[kind] for kind in kinds])
        assert sorted(kinds) == sorted(ORDER)
        # only the reply is trained on
        assert all(mask[0] == -100 and any(label != -100 for label in mask) for mask in group["masks"])


def test_curriculum_moves_up_when_the_model_keeps_solving(tmp_path, tokenizer_dir, tokenizer, generated):
    levels_asked: list[int] = []

    def answer(prompt: str, index: int) -> str:
        _, solution, generator_id = lookup(generated, prompt)
        if index == 0:
            levels_asked.append(MathCurriculum().level_of(generator_id))
        return REPLIES["right" if index % 4 else "right_unboxed"](solution)

    with ScriptedInference(answer, tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.min_evaluations", "4",
                                "--env.process_concurrency", "1", steps=3, group_size=4)
    assert len(groups) == 3
    # four right answers (min_evaluations 4, threshold 0.8) move the level up after each group
    assert levels_asked == [1, 2, 3]


def test_word_problems_from_a_second_model(tmp_path, tokenizer_dir, tokenizer, generated):
    def answer(prompt: str, index: int) -> str:
        if "Exercise: " in prompt:  # the rewriting request
            return f"At the bakery, Noor wonders: {prompt.split('Exercise: ')[-1].strip()}"
        return REPLIES[ORDER[index % 4]](lookup(generated, prompt)[1])

    with ScriptedInference(answer, tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.word_problem_openai_base_url",
                                f"{server.url}/v1", "--env.word_problem_model_name", "rewriter", steps=1, group_size=4)
        rewrites = [r for r in server.requests if r.get("model") == "rewriter"]
    assert len(groups) == 1 and rewrites
    question = groups[0]["messages"][0][1]["content"]
    assert question.startswith("At the bakery, Noor wonders: ")
    assert sorted(groups[0]["scores"]) == pytest.approx(sorted(EXPECTED.values()))


def test_evaluate_at_the_current_level(tmp_path, tokenizer_dir, tokenizer, generated):
    def answer(prompt: str, index: int) -> str:
        return REPLIES["right"](lookup(generated, prompt)[1])

    with ScriptedInference(answer, tokenizer) as server:
        run_cli(SCRIPT, "evaluate", "--env.tokenizer_name", str(tokenizer_dir), "--openai.base_url",
                f"{server.url}/v1", "--openai.model_name", "scripted", "--openai.api_key", "x",
                "--env.use_wandb", "false", "--env.data_dir_to_save_evals", str(tmp_path / "eval"))
    results = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert results["eval/level_1_accuracy"] == 1.0
    assert results["eval/current_level"] == 1
    assert results["eval/advanced_level"] == 1  # ten right answers at level 1 (min_evaluations 10)


def test_answer_helpers_and_practice_session():
    assert extract_boxed(r"so \boxed{\frac{15}{32}} it is") == r"\frac{15}{32}"
    assert answers_match(r"<think>x</think> \boxed{\dfrac{15}{32}}", r"$\frac{15}{32}$")
    assert answers_match("<think>x</think>\n1,234", "$1234$")
    assert not answers_match(r"<think>x</think> \boxed{12}", "$13$")
    session = InfiniteMath(min_evaluations=2)
    for _ in range(2):
        result = session.submit_answer(session.current_solution)
        assert result["is_correct"]
    assert result["did_advance_level"] and session.curriculum.get_current_level() == 2
    wrong = session.submit_answer("definitely not it")
    assert not wrong["is_correct"] and wrong["attempts_remaining"] == 2 and wrong["correct_answer"] is None
