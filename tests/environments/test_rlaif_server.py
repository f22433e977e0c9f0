"""rlaif_server.py offline: two scripted replies per WildChat-style prompt, the scripted judge's
six verdicts (three per order) turned into opposite scores, truncated replies, dropped groups."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import pytest
from fastapi import Request
from transformers import AutoTokenizer

from environments.rlaif_server import judge_choice, pairwise_scores
from tests.environments.harness import ENVIRONMENTS, process_groups
from tests.environments.scripted_inference import ScriptedInference

FIXTURE = str(ENVIRONMENTS / "fixtures" / "rlaif" / "train.jsonl")
ELDRITCH = "The tide remembers older stars; something vast stirs beneath your question."
PLAIN = "Sure, here is a simple and friendly answer."
JUDGE_MARK = "--- Response A ---"


class ScriptedWithFinishReasons(ScriptedInference):
    """ScriptedInference whose ``/generate`` finish reason is chosen per (prompt, choice)."""

    def __init__(self, answer: Callable[[str, int], str], tokenizer: Any, finish: Callable[[str, int], str]) -> None:
        self.finish = finish
        super().__init__(answer, tokenizer)

    def _app(self):
        app = super()._app()

        @app.post("/generate")
        async def generate(request: Request) -> dict[str, Any]:
            body = await request.json()
            self.requests.append(body)
            prompt_ids = body["prompt"]["prompt_token_ids"]
            prompt = self.tokenizer.decode(prompt_ids)
            n = int(body.get("n") or 1)
            texts = self._choices(prompt, n)
            token_ids = [list(self.tokenizer.encode(text, add_special_tokens=False)) or [0] for text in texts]
            return {"prompt_token_ids": prompt_ids, "token_ids": token_ids,
                    "logprobs": [[[{str(t): -0.1}] for t in ids] for ids in token_ids],
                    "finish_reasons": [self.finish(prompt, i) for i in range(n)]}

        app.router.routes.insert(0, app.router.routes.pop())  # ours answers /generate first
        return app


def response_a(prompt: str) -> str:
    return prompt.split(JUDGE_MARK, 1)[1].split("--- Response B ---", 1)[0].strip()


def judge(prompt: str, index: int) -> str:
    """Verdicts by topic: position-biased on the cat question, prefers the plain reply on the
    Mars one, otherwise mostly prefers the eldritch reply (with one stray vote per order)."""
    eldritch_is_a = response_a(prompt) == ELDRITCH
    if "grey cat" in prompt:
        return "\\boxed{A}"
    if "weather on Mars" in prompt:
        return "\\boxed{B}" if eldritch_is_a else "\\boxed{A}"
    if eldritch_is_a:
        return ["<think>A is eerier.</think> \\boxed{A}", "\\boxed{A}", "Hmm. I pick \\boxed{B}."][index]
    return ["<think>B is eerier.</think>\\boxed{B}", "\\boxed{ A }", "I cannot decide."][index]


def answer(prompt: str, index: int) -> str:
    if JUDGE_MARK in prompt:
        return judge(prompt, index)
    return ELDRITCH if index == 0 else PLAIN


def finish(prompt: str, index: int) -> str:
    if "lighthouse" in prompt:
        return "length"
    if "haiku" in prompt and index == 1:
        return "length"
    return "stop"


@pytest.fixture
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_judge_choice_reads_the_last_boxed_letter() -> None:
    assert judge_choice("\\boxed{A}") == "A"
    assert judge_choice("first \\boxed{A}, final \\boxed{ B }.") == "B"
    assert judge_choice("\\boxed{A or B}") is None
    assert judge_choice("B") is None
    assert judge_choice(None) is None


def test_pairwise_scores_count_swapped_votes_for_the_other_reply() -> None:
    # Forward: first reply is A. Reversed: first reply is B.
    assert pairwise_scores(["A", "A", "A"], ["B", "B", "B"]) == (0.5, -0.5)
    assert pairwise_scores(["A", "A", "A"], ["A", "A", "A"]) == (0.0, 0.0)  # pure position bias: a tie
    first, second = pairwise_scores(["A", "A", "B"], ["B", "A", None])
    assert first == pytest.approx(3 / 6 - 5 / 12) and second == pytest.approx(2 / 6 - 5 / 12)
    assert pairwise_scores([None, None, None], [None, None, None]) == (0.0, 0.0)


def test_process_scores_pairs_by_swapped_judgement_and_truncation(tokenizer_dir: Path, tmp_path: Path, tokenizer,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.99)  # never add the preference system prompt
    with ScriptedWithFinishReasons(answer, tokenizer, finish) as server:
        groups = process_groups("rlaif_server.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", FIXTURE, "--env.max_token_length", "512",
                                "--env.ensure_scores_are_not_same", "true", steps=6, server_type="vllm")
    # 8 prompts: the cat one is a tie (dropped, as serve drops it), the lighthouse one is truncated
    # twice (no group).
    by_topic = {group["messages"][0][-2]["content"]: group for group in groups}  # the last user turn
    assert len(groups) == 6 and not any("grey cat" in topic or "lighthouse" in topic for topic in by_topic)
    for topic, group in by_topic.items():
        assert [m[-1]["content"] for m in group["messages"]] == [ELDRITCH, PLAIN]
        assert all(m[-1]["role"] == "assistant" for m in group["messages"])
        if "haiku" in topic:
            assert group["scores"] == [1.0, -1.0]  # the truncated reply loses, no judge asked
        elif "weather on Mars" in topic:
            assert group["scores"] == pytest.approx([-0.5, 0.5])
        else:
            assert group["scores"] == pytest.approx([1 / 12, -1 / 12])
        for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
            assert len(tokens) == len(masks) == len(logprobs)
            trained = [i for i, m in enumerate(masks) if m != -100]
            assert trained and all(logprobs[i] == pytest.approx(-0.1) for i in trained)
    # The final assistant reply of a multi-turn chat is cut off; earlier turns stay in the prompt.
    birthday = next(g for t, g in by_topic.items() if "funnier" in t)
    assert [m["role"] for m in birthday["messages"][0]] == ["user", "assistant", "user", "assistant"]
    assert "vintage" not in birthday["messages"][0][-1]["content"]

    judge_requests = [body for body in server.requests if "messages" in body]
    rollout_requests = [body for body in server.requests if "prompt" in body]
    assert len(rollout_requests) == 8 and all(body["n"] == 2 for body in rollout_requests)
    # Two judge calls (n=3, one per order) for each of the 6 prompts with no truncated reply.
    assert len(judge_requests) == 12 and all(body["n"] == 3 for body in judge_requests)
    orders = [response_a(body["messages"][1]["content"]) for body in judge_requests]
    assert orders.count(ELDRITCH) == orders.count(PLAIN) == 6
    assert not any("haiku" in body["messages"][1]["content"] or "lighthouse" in body["messages"][1]["content"]
                   for body in judge_requests)


def test_preference_system_prompt_is_given_to_one_reply_and_not_trained_on(tokenizer_dir: Path, tmp_path: Path,
                                                                           tokenizer,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.0)  # always take the 5 % branch

    def steered(prompt: str, index: int) -> str:
        if JUDGE_MARK in prompt:
            return "\\boxed{A}" if response_a(prompt) == ELDRITCH else "\\boxed{B}"
        return ELDRITCH if "eldritch" in prompt else PLAIN

    with ScriptedWithFinishReasons(steered, tokenizer, lambda prompt, index: "stop") as server:
        groups = process_groups("rlaif_server.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", FIXTURE, "--env.max_token_length", "512",
                                "--env.process_concurrency", "1", steps=1, server_type="vllm")
    assert len(groups) == 1
    group = groups[0]
    assert group["scores"] == pytest.approx([0.5, -0.5])
    assert [m[-1]["content"] for m in group["messages"]] == [ELDRITCH, PLAIN]
    assert all(message["role"] != "system" for chat in group["messages"] for message in chat)
    rollout_prompts = [tokenizer.decode(body["prompt"]["prompt_token_ids"])
                       for body in server.requests if "prompt" in body]
    assert len(rollout_prompts) == 2 and sum("eldritch" in prompt for prompt in rollout_prompts) == 1
    # The steered reply's tokens hold the system prompt it was sampled with.
    assert "eldritch" in tokenizer.decode(group["tokens"][0]) and "eldritch" not in tokenizer.decode(group["tokens"][1])
