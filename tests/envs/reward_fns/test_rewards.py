"""Reward functions by name, with Atropos's results and the combined-weight fix."""

from __future__ import annotations

import pytest

from atroposlib.envs.reward_fns import CombinedReward, RewardFunction, registry

ASSISTANT = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731


@pytest.mark.parametrize("name, expected", [
    ("accuracy", "AccuracyReward"), ("accuracy_reward", "AccuracyReward"), ("format", "FormatReward"),
    ("format_reward", "FormatReward"), ("combined", "CombinedReward"), ("crossword_format", "CrosswordFormatReward"),
    ("reasoning_steps", "ReasoningStepsReward"), ("r1", "R1Reward"), ("cascading_r1_math", "cascading_r1_math_reward"),
])
def test_names_resolve_to_the_right_reward(name: str, expected: str) -> None:
    assert registry.get(name).__name__ == expected


def test_accuracy_verifies_math_and_handles_gsm8k_gold() -> None:
    reward = registry.create("accuracy")
    completions = ["<think>2+2</think>The answer is \\boxed{4}", "\\boxed{5}", ASSISTANT("so \\boxed{\\frac{1}{2}}")]
    assert reward(completions, solution=["4", "#### 4", "0.5"]) == [1.0, 0.0, 1.0]
    assert reward(["\\boxed{1}" * 7], solution="1") == [0.0]
    assert reward(["\\boxed{4}"]) == [0.0]


def test_format_and_config_dicts() -> None:
    reward = registry.create({"type": "format", "weight": 0.5, "params": {"require_all_tags": True}})
    assert reward.weight == 0.5
    assert reward(["<think>a</think><answer>b</answer>", "<THINK>a</THINK>"]) == [0.5, 0.0]


def test_r1_family() -> None:
    r1 = registry.create("r1")
    good, no_think = "<think>reasoning</think> Paris", "Paris"
    assert r1.compute([good, no_think], solution="paris") == [1.5, 1.0]
    assert registry.create("formatreasoning").compute(["<think>a</think><think>b</think>x"]) == [0.0]


def test_combined_applies_sub_weights_unless_legacy() -> None:
    rewards = [{"type": "format", "weight": 2.0}, {"type": "accuracy", "weight": 0.5}]
    combined = CombinedReward(rewards=rewards)
    assert combined.name == "combined(formatreward,accuracyreward)"
    assert combined.compute(["<think>x</think>\\boxed{3}"], solution="3") == [2.5]
    assert CombinedReward(rewards=rewards, legacy_unweighted=True).compute(["<think>x</think>\\boxed{3}"], solution="3") == [2.0]
    assert CombinedReward(rewards=rewards, normalization="sum").compute(["<think>x</think>\\boxed{3}"], solution="3") == [1.0]


def test_reasoning_steps_crossword_and_cascading() -> None:
    steps = "Step 1: read. Step 2: think. Step 3: answer. First we add, then we check, finally we answer the question here."
    assert registry.create("reasoning_steps").compute([steps, "no"]) == [pytest.approx(0.9), 0.0]
    crossword = registry.create("crossword_format")
    assert crossword.compute(["1-Across: CAT\n2-Down: DOG", "1-Across: cat", "nothing"]) == [1.0, 0.0, 0.0]
    cascading = registry.create("cascading_r1_math")
    assert cascading(["<think>x</think>\\boxed{3}", "\\boxed{3}", "<think>x</think>\\boxed{2}"], solution="3") == [1.5, 1.0, 0.0]


def test_failures_score_zero_and_bad_registrations_are_refused() -> None:
    class Broken(RewardFunction):
        def compute(self, completions, **kwargs):
            raise RuntimeError("boom")

    assert Broken()(["a", "b"]) == [0.0, 0.0]
    with pytest.raises(TypeError):
        registry.register(int)
    with pytest.raises(ImportError, match="no reward function named 'nope'"):
        registry.get("nope")


def test_load_required_functions() -> None:
    config = {"datasets": [{"dataset_reward_funcs": ["accuracy"]}], "reward_functions": [{"type": "format"}]}
    assert registry.load_required_functions(config) == ["accuracy", "format"]


def test_repetition_penalty() -> None:
    reward = registry.create("repetition_penalty")
    varied = ("Photosynthesis converts light into chemical energy. Plants store that energy as sugar. "
              "Animals later eat those plants and release the stored energy through respiration.")
    looping = "The cat sat on the mat today. " * 4
    stutter = ("We we we need need need more more more data data data. Models models models learn learn "
               "learn slowly slowly slowly anyway.")
    scores = reward.compute([varied, looping, "Too short.", stutter])
    assert scores[0] == 0.0
    assert scores[1] == pytest.approx(-0.6 - 0.4 * min(1, 3 / 4))
    assert scores[2] == -0.1
    assert -1.0 <= scores[3] <= -0.1
    assert registry.get("repetition_penalty").__name__ == "RepetitionPenaltyReward"
