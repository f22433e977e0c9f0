"""environments/instruction_following_algorithm_environment.py (InstructionFollowingEnv): the
constraint verifiers, the think-format rule, too-easy groups, the length penalty and the
adaptive curriculum."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from environments.instruction_following_algorithm_environment import (
    IF_FUNCTIONS_MAP,
    APIServerConfig,
    IFConfig,
    InstructionFollowingEnv,
)
from tests.environments.harness import ENVIRONMENTS, process_groups
from tests.environments.scripted_inference import ScriptedInference

FIXTURE = ENVIRONMENTS / "fixtures" / "instruction_following" / "rlvr_ifeval.jsonl"

# instruction (substring of the prompt) -> (a response meeting the constraint, one that does not)
RESPONSES = {
    "rainy afternoon": ("it was grey and calm; the streets were quiet.", "It Was Grey And Calm."),
    "benefits of cycling": ("* less traffic\n* exercise\n* saves money", "* less traffic\n* exercise"),
    "watering your plants": ("Thank you so much for the help. Any other questions?", "Thanks. Any other questions? Bye."),
    "what a compiler does": ("It turns source code into machine code.", "It translates programs."),
    "first job interview": ("Arrive early and be yourself.", "Arrive early, be calm, and smile."),
    "water cycle": ("<<The Water Cycle>>\nWater evaporates and falls as rain.", "Water evaporates and falls as rain."),
    "limerick about a cat": ('"There once was a cat from Peru."', "There once was a cat from Peru."),
    "ideal weekend": ("Reading in the park and cooking dinner with friends.", "word " * 30),
    "Is the sky blue": ("My answer is yes.", "Yes, it is blue today."),
    "photosynthesis": ("Plants make food from light.\n\nP.S. Trees do it too.", "Plants make food from light."),
    "description for a lamp": ("SECTION 1\nA bright lamp.\nSECTION 2\nWarm light.", "SECTION 1\nA bright lamp."),
    "about the moon": ("The moon is bright. The moon orbits Earth.", "The moon is bright."),
}


def _responses(prompt: str) -> tuple[str, str]:
    return next(pair for key, pair in RESPONSES.items() if key in prompt)


def answer(prompt: str, index: int) -> str:
    good, bad = _responses(prompt)
    return [f"<think>case0 planning</think>\n{good}",  # passes
            f"<think>case1 planning</think>\n{bad}",  # breaks the constraint
            good,  # no think block
            f"<think>case3</think><think>again</think>\n{good}"][index % 4]  # two think blocks


def test_process_scores_constraints_and_the_think_format(tokenizer_dir: Path, tmp_path: Path) -> None:
    with ScriptedInference(answer, AutoTokenizer.from_pretrained(str(tokenizer_dir))) as server:
        groups = process_groups("instruction_following_algorithm_environment.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", str(FIXTURE), steps=3, group_size=4, server_type="vllm")
    assert len(groups) == 3
    for group in groups:
        assert len(group["inference_logprobs"]) == 4
        for messages, score in zip(group["messages"], group["scores"]):
            assert score == (1.0 if "case0" in messages[-1]["content"] else 0.0)


def test_every_constraint_type_has_a_verifier_that_tells_pass_from_fail() -> None:
    assert len(IF_FUNCTIONS_MAP) == 25
    cases = [  # (name, args, passing text, failing text)
        ("verify_keywords", {"keyword_list": ["Source", "machine"]}, "source and MACHINE", "source only"),
        ("verify_keyword_frequency", {"word": "moon", "N": 2}, "Moon, the moon! Moonlight.", "the moon"),
        ("validate_forbidden_words", {"forbidden_words": ["bad"]}, "all good", "a BAD idea"),
        ("verify_letter_frequency", {"letter": "z", "N": 2}, "jazz", "jaz"),
        ("validate_response_language", {"language": "fr"},
         "Ceci est une phrase écrite en français pour vérifier la langue.", "This sentence is written in English."),
        ("verify_paragraph_count", {"N": 2}, "One.\n  * * *  \nTwo.", "One.\n\nTwo."),
        ("validate_word_constraint", {"N": 10, "quantifier": "around"}, "w " * 11, "w " * 13),
        ("verify_sentence_constraint", {"N": 2, "quantifier": "at most"}, "Mr. Smith came. He left, e.g. at noon.",
         "One. Two. Three."),
        ("validate_paragraphs", {"N": 2, "first_word": "then", "i": 2}, "First part.\n\nThen more.", "First.\n\nNext."),
        ("verify_postscript", {"postscript_marker": "P.S."}, "Hi.\nP.S. bye", "Hi. Bye."),
        ("validate_placeholders", {"N": 2}, "Send [item] to [address].", "Send it to [address]."),
        ("verify_bullet_points", {"N": 2}, "* a\n- b\nplain", "* a\nplain"),
        ("validate_title", {}, "<<Title>> text", "Title text"),
        ("validate_choice", {"options": ["My answer is yes."]}, " my answer is YES. ", "My answer is yes, of course."),
        ("validate_highlighted_sections", {"N": 2}, "*one* and **two**", "*one* and ** **"),
        ("validate_sections", {"N": 2, "section_splitter": "Section"}, "SECTION 1: a\nSection 2. b", "Section 1: a"),
        ("validate_json_format", {}, ' {"a": [1, 2]} ', "{a: 1}"),
        ("validate_repeat_prompt", {"original_prompt": "Say  hi."}, "Say hi. Hi!", "Hi! Say hi."),
        ("validate_two_responses", {}, "First.\n******\nSecond.", "Same.\n******\nSame."),
        ("validate_uppercase", {}, "ALL CAPS, 100%", "Not caps"),
        ("validate_lowercase", {}, "all lower, 100%", "Not lower"),
        ("validate_frequency_capital_words", {"N": 2, "quantifier": "at least"}, "NASA and ESA, not A", "NASA only"),
        ("validate_end", {"end_phrase": "Is there anything else?"}, "Done. Is there anything else? \n", "Is there anything else? Yes"),
        ("validate_quotation", {}, ' "quoted" ', '"half'),
        ("validate_no_commas", {}, "no commas here", "one, two"),
    ]
    assert {name for name, *_ in cases} == set(IF_FUNCTIONS_MAP)
    for name, args, passing, failing in cases:
        verify = IF_FUNCTIONS_MAP[name]
        result = verify(passing, **args)
        assert (result[0] if isinstance(result, tuple) else result) is True, name
        result = verify(failing, **args)
        assert (result[0] if isinstance(result, tuple) else result) is False, name


@pytest.fixture
def env(tokenizer_dir: Path) -> InstructionFollowingEnv:
    config = IFConfig(tokenizer_name=str(tokenizer_dir), group_size=4, use_wandb=False, train_file=str(FIXTURE),
                      max_token_length=100)
    server = APIServerConfig(model_name="scripted", base_url="http://127.0.0.1:9/v1", api_key="x", server_type="vllm",
                             tokenizer_name=str(tokenizer_dir), health_check=False)
    environment = InstructionFollowingEnv(config, [server], slurm=False)
    asyncio.run(environment.setup())
    return environment


def test_score_response_needs_one_think_block_before_the_answer(env: InstructionFollowingEnv) -> None:
    assert env.score_response("<think>x</think> all lower", "validate_lowercase", {}) == 1.0
    assert env.score_response("<THINK>x</THINK> all lower", "validate_lowercase", {}) == 1.0
    assert env.score_response("</think>x<think> all lower", "validate_lowercase", {}) == 0.0
    assert env.score_response("<think>x</think> all lower <think>", "validate_lowercase", {}) == 0.0
    assert env.score_response("<think>x</think> all lower", "not_a_constraint", {}) == 0.0
    assert env.score_response("<think>x</think> only this", "verify_keywords", {}) == 0.0  # missing argument


def _rollout(length: int, score: float) -> dict[str, Any]:
    return {"messages": [{"role": "assistant", "content": "x"}], "score": score, "tokens": [1] * length,
            "masks": [-100] * 5 + [1] * (length - 5), "logprobs": [0.0] * length}


def test_too_easy_groups_are_dropped_and_all_passing_ones_get_a_length_penalty(env: InstructionFollowingEnv) -> None:
    item = {"func_name": "validate_lowercase", "args": {}, "item_id": "validate_lowercase_1"}
    mixed = asyncio.run(env.score([_rollout(40, 1.0), _rollout(40, 0.0), _rollout(40, 0.0), _rollout(40, 0.0)], item))
    assert mixed["scores"] == [1.0, 0.0, 0.0, 0.0] and len(mixed["inference_logprobs"]) == 4
    all_pass = [_rollout(length, 1.0) for length in (50, 75, 90, 100)]
    assert asyncio.run(env.score(all_pass, item)) is None  # average 1.0 > 0.75: too easy
    env.config.max_group_average_for_training = 1.0
    penalised = asyncio.run(env.score(all_pass, item))  # linear above 75 of max_token_length 100
    assert penalised["scores"] == pytest.approx([1.0, 1.0, 0.4, 0.0])


def test_the_curriculum_retires_solved_items_and_recycles_the_rest(env: InstructionFollowingEnv) -> None:
    queued = len(env.active_train_queue)
    assert queued == len(env.train) == 11 and len(env.test) == 1
    first, second = asyncio.run(env.get_next_item()), asyncio.run(env.get_next_item())
    assert len(env.active_train_queue) == queued - 2 and first["attempt_count"] == 1
    env._handle_item_result(first, 0.25, [1.0, 0.0, 0.0, 0.0])  # unsolved: back at the end of the queue
    env._handle_item_result(second, 1.0, [1.0] * 4)  # solved: out of circulation
    assert env.active_train_queue[-1] == first["raw_item"] and env.solved_items == [second["raw_item"]]
    for _ in range(queued - 1):
        asyncio.run(env.get_next_item())
    again = asyncio.run(env.get_next_item())  # the queue is empty while items are out: one is tried again
    assert again["raw_item"] in env.train
    env.config.solve_on_single_correct = True
    env._handle_item_result(first, 0.25, [1.0, 0.0, 0.0, 0.0])
    assert first["raw_item"] in env.solved_items
