"""tool_use_multiturn_server.py offline: full scripted episodes in every scenario (tool results
replayed from the fixtures, per-turn validation, early termination), the episode reward, the
length penalty, the completed-task filter and evaluation."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Optional

import pytest
from transformers import AutoTokenizer

from environments.tool_use_multiturn_server import (
    APOLOGY, MISMATCH, NARRATION_THINK_HELPER, SEQ_TOOL_HELPER, calls_match, few_shot_example, normalize_tool_calls,
    parse_expected_call, score_episode, system_prompt, valid_narration, valid_tool_calls,
)
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from tests.environments.harness import ENVIRONMENTS, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

FIXTURES = ENVIRONMENTS / "fixtures" / "multiturn_tool_use"
TRAIN, TEST = str(FIXTURES / "train.jsonl"), str(FIXTURES / "test.jsonl")
GENERATION_PROMPT = "<|assistant|>"  # the test tokenizer's template: <|role|>content<|end|> ... <|assistant|>


def rows(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def gold_turns(conversation: list[dict]) -> list[list[dict]]:
    """The calls of each tool-calling turn of a conversation, arguments decoded."""
    turns = []
    for message in conversation:
        if message["from"] == "gpt" and "<tool_call>" in message["value"]:
            turns.append([parse_expected_call(body)
                          for body in re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", message["value"], re.S)])
    return turns


EPISODES = {row["conversations"][1]["value"]: gold_turns(row["conversations"]) for row in rows(TRAIN) + rows(TEST)}


def as_json(calls: list[dict]) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in calls)


def wrong(calls: list[dict]) -> list[dict]:
    name, value = next(iter(calls[0]["arguments"].items()))
    return [{**calls[0], "arguments": {**calls[0]["arguments"], name: f"not {value}"}}] + calls[1:]


def phase(prompt: str) -> tuple[list[list[dict]], str, int, Optional[int]]:
    """(the episode's gold turns, "call" or "narrate", tool results so far, rollout id or None)
    of a prompt: what the model is asked for depends on the last message."""
    assert prompt.endswith(GENERATION_PROMPT)
    episode = next(turns for human, turns in EPISODES.items() if human in prompt)
    body = prompt[: -len(GENERATION_PROMPT)]
    last = [part for part in body.split("<|end|>") if part][-1]
    marker = re.search(r"\[r(\d+)\]", body)
    return episode, ("narrate" if last.startswith("<|tool|>") else "call"), body.count("<|tool|>"), (
        int(marker.group(1)) if marker else None)


def scripted(behaviour: Callable[[int, str, int, list[list[dict]]], str]) -> Callable[[str, int], str]:
    """An answer function from ``behaviour(rollout, kind, tool results so far, gold turns)``;
    the rollout is the choice index on the first turn and the [rN] tag of its replies later."""
    def answer(prompt: str, index: int) -> str:
        episode, kind, done, rollout = phase(prompt)
        return behaviour(index if rollout is None else rollout, kind, done, episode)
    return answer


@pytest.fixture
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


# ------------------------------------------------------------------ reply checks and the reward
def test_reply_validation_and_call_matching() -> None:
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert valid_tool_calls("<think>x</think>\n" + call) == [{"name": "f", "arguments": {"a": 1}}]
    assert valid_tool_calls("<think>x</think>\n" + call + call) == [{"name": "f", "arguments": {"a": 1}}] * 2
    assert valid_tool_calls(call) is None  # no leading think block
    assert valid_tool_calls("<think>x</think> I will call it.\n" + call) is None  # text before the call
    assert valid_tool_calls("<think>x</think>\n" + call + "\nDone.") is None  # text after it
    assert valid_tool_calls("<think>x</think>\n<tool_call>{'name': 'f', 'arguments': {'a': 1}}</tool_call>") == [
        {"name": "f", "arguments": {"a": 1}}]  # Python literals are accepted
    assert valid_tool_calls("<think>x</think>\n" + call + "<tool_response>{}</tool_response>") is None
    assert valid_narration("<think>x</think>It is sunny.")
    assert not valid_narration("It is sunny.") and not valid_narration("<think>x</think><think>y</think>Hi")
    assert not valid_narration("<think>x</think>Hi " + call)
    assert normalize_tool_calls("<think>x</think><tool_call>{'a': 1}</tool_call>") == \
        '<think>x</think>\n<tool_call>\n{"a":1}\n</tool_call>\n'
    expected = parse_expected_call('{"name": "set", "arguments": "{\\"on\\": false, \\"n\\": 3}"}')
    assert expected == {"name": "set", "arguments": {"on": False, "n": 3}}
    assert calls_match({"name": "set", "arguments": {"on": "False", "n": 3, "extra": 1}}, expected)
    assert not calls_match({"name": "set", "arguments": {"on": True, "n": 3}}, expected)


def test_episode_reward() -> None:
    gold = ['{"name":"a","arguments":{"x":1}}', '{"name":"b","arguments":{}}']
    right = [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]
    assert score_episode(right, gold) == (1.5, 2)
    assert score_episode(right[:1] + [MISMATCH], gold) == pytest.approx((0.3, 1))
    assert score_episode([], gold) == (0.0, 0)
    assert score_episode([right[0], APOLOGY, right[1]], gold) == (1.5, 2)  # narration tags are not calls
    assert score_episode([APOLOGY], []) == (1.1, 0)
    assert score_episode([MISMATCH], [], wrong_call_penalty=-0.3) == (-0.3, 0)


# ------------------------------------------------------------------ full episodes
def multiturn_behaviour(rollout: int, kind: str, done: int, episode: list[list[dict]]) -> str:
    """r0 right throughout; r1 gets the second call wrong; r2 calls without thinking; r3 uses
    Python literals with an extra argument and apologises; r4 calls a tool while narrating."""
    tag = f"<think>[r{rollout}] working on it</think>\n"
    if kind == "narrate":
        if rollout == 3:
            return tag + "Sorry for the wait: the tool has answered."
        if rollout == 4:
            return tag + "Done.\n" + as_json(episode[0])
        return tag + "Here is what the tool reported."
    calls = episode[done]
    if rollout == 1 and done == 1:
        return tag + as_json(wrong(calls))
    if rollout == 2:
        return as_json(calls)
    if rollout == 3:
        return tag + "\n".join(f"<tool_call>\n{ {**c, 'arguments': {**c['arguments'], 'note': 'x'}} }\n</tool_call>"
                               for c in calls)
    return tag + as_json(calls)


def test_multiturn_episodes_are_played_to_the_end(tokenizer_dir: Path, tmp_path: Path, tokenizer) -> None:
    completed = tmp_path / "completed.jsonl"
    completed.write_text(json.dumps({"task": "Find me a Thai restaurant in Leeds."}) + "\n")
    with ScriptedInference(scripted(multiturn_behaviour), tokenizer) as server:
        groups = process_groups("tool_use_multiturn_server.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", TRAIN, "--env.test_file", TEST,
                                "--env.completed_dataset_id", str(completed), steps=4, group_size=5)
    # Multi-turn episodes: Paris, ACME, flights (3 calls, capped at 2), reminder; Leeds is completed.
    firsts = sorted(group["messages"][0][1]["content"] for group in groups)
    assert firsts == sorted(["What's the weather in Paris today?", "How much is one ACME share right now?",
                             "Any flights from AMS to LIS on 2025-05-02?", "Remind me to call mom in 30 minutes."])
    for group in groups:
        assert group["scores"] == [1.5, -1.0, -1.0, 1.5, -1.0]
        chats = group["messages"]
        assert [len(chat) for chat in chats] == [9, 7, 3, 9, 5]
        full = chats[0]
        assert [m["role"] for m in full] == ["system", "user", "assistant", "tool", "assistant", "user",
                                            "assistant", "tool", "assistant"]
        assert full[0]["content"].startswith(system_prompt) and few_shot_example in full[0]["content"]
        assert full[3]["content"].startswith("<tool_response>") and full[3]["content"].endswith(NARRATION_THINK_HELPER)
        episode = EPISODES[full[1]["content"]]
        assert valid_tool_calls(full[6]["content"]) == episode[1]
        # Every rollout's trajectory ends with its own last reply, even when it ended the rollout.
        assert chats[2][-1]["content"].startswith("<tool_call>") and "[r4]" in chats[4][-1]["content"]
        assert "not " in chats[1][-1]["content"]
        # Only that final reply is trained.
        for chat, tokens, masks in zip(chats, group["tokens"], group["masks"]):
            trained = [t for t, m in zip(tokens, masks) if m != -100]
            assert tokenizer.decode(trained).startswith(chat[-1]["content"])
    # Per episode: one request with n=5, then 4 + 3 + 2 single requests as rollouts drop out.
    assert len(server.requests) == 4 * 10
    assert sorted(body["n"] for body in server.requests).count(5) == 4
    assert all(body["temperature"] == 0.8 and body["max_tokens"] == 1024 for body in server.requests)


def test_multistep_episode_replays_tool_results_between_calls(tokenizer_dir: Path, tmp_path: Path, tokenizer) -> None:
    def behaviour(rollout: int, kind: str, done: int, episode: list[list[dict]]) -> str:
        # Multistep asks for the next call right after each tool result (no narration turns).
        if rollout == 1:  # both calls at once
            return "<think>[r1] both</think>\n" + as_json(episode[0] + episode[1])
        return f"<think>[r0] step {done}</think>\n" + as_json(episode[done])

    with ScriptedInference(scripted(behaviour), tokenizer) as server:
        groups = process_groups("tool_use_multiturn_server.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", TRAIN, "--env.test_file", TEST,
                                "--env.scenario_category", "multistep", steps=1, group_size=2)
    assert len(groups) == 1 and groups[0]["scores"] == [1.5, -1.0]
    right = groups[0]["messages"][0]
    assert [m["role"] for m in right] == ["system", "user", "assistant", "tool", "assistant"]
    assert right[1]["content"].endswith(SEQ_TOOL_HELPER)
    assert "u-881" in right[3]["content"] and NARRATION_THINK_HELPER not in right[3]["content"]
    assert len(server.requests) == 2


def test_relevance_episode_rewards_apologies_and_rejects_malformed_replies(tokenizer_dir: Path, tmp_path: Path,
                                                                          tokenizer) -> None:
    replies = [
        "<think>No tool orders food.</think>I'm sorry, I can't order pizza. Could you provide another request?",
        "<think>No tool fits.</think>Ordering food is not something I can do here.",
        "<think>Try anyway.</think>\n<tool_call>\n{\"name\": \"define_word\", \"arguments\": {\"word\": \"pizza\"}}"
        "\n</tool_call>",
        "Sorry, no.",
    ]
    with ScriptedInference(lambda prompt, index: replies[index], tokenizer) as server:
        groups = process_groups("tool_use_multiturn_server.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", TRAIN, "--env.test_file", TEST,
                                "--env.scenario_category", "relevance", steps=1, group_size=4)
    assert len(groups) == 1
    assert groups[0]["scores"] == pytest.approx([1.2, 1.0, -1.0, -1.0])
    assert "order me a pizza" in groups[0]["messages"][0][1]["content"]
    assert len(server.requests) == 1


def test_length_penalty_when_every_rollout_is_right(tokenizer_dir: Path, tmp_path: Path, tokenizer) -> None:
    paris = rows(TRAIN)[0]
    one_row = tmp_path / "one.jsonl"
    one_row.write_text(json.dumps(paris) + "\n")
    gold = EPISODES[paris["conversations"][1]["value"]][0]
    replies = ["<think>short</think>\n" + as_json(gold),
               "<think>" + "thinking it over " * 300 + "</think>\n" + as_json(gold)]
    system = system_prompt + "\n\n" + paris["conversations"][0]["value"] + "\n\n" + few_shot_example
    short = tokenize_for_trainer(tokenizer, [{"role": "system", "content": system},
                                             {"role": "user", "content": paris["conversations"][1]["value"]},
                                             {"role": "assistant", "content": normalize_tool_calls(replies[0])}])
    max_length = 2 * (len(short["tokens"]) + 4)
    with ScriptedInference(lambda prompt, index: replies[index], tokenizer) as server:
        groups = process_groups("tool_use_multiturn_server.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", str(one_row), "--env.scenario_category", "single",
                                "--env.max_token_length", str(max_length), steps=1, group_size=2)
    assert len(groups) == 1
    lengths = [len(tokens) for tokens in groups[0]["tokens"]]
    cutoff = max_length / 2
    assert lengths[0] == len(short["tokens"]) and lengths[1] > cutoff
    expected_long = max(0.0, 1.5 - min((lengths[1] - cutoff) / (max_length - cutoff), 1.0))
    assert groups[0]["scores"] == pytest.approx([1.5, expected_long])
    assert len(server.requests) == 1


def test_evaluate_plays_held_out_episodes_greedily(tokenizer_dir: Path, tmp_path: Path, tokenizer) -> None:
    def behaviour(rollout: int, kind: str, done: int, episode: list[list[dict]]) -> str:
        if "Bristol" in json.dumps(episode):
            return as_json(episode[0])  # malformed (no <think>): the episode stops with nothing right
        if kind == "narrate":
            return "<think>ok</think>Here you go."
        return "<think>ok</think>\n" + as_json(episode[done])

    out = tmp_path / "evals"
    with ScriptedInference(scripted(behaviour), tokenizer) as server:
        run_cli("tool_use_multiturn_server.py", "evaluate", "--env.tokenizer_name", str(tokenizer_dir),
                "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted", "--openai.api_key", "x",
                "--env.use_wandb", "false", "--env.train_file", TRAIN, "--env.test_file", TEST,
                "--env.data_dir_to_save_evals", str(out))
    metrics = json.loads((out / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/avg_reward"] == pytest.approx(0.75)  # 1.5 for Oslo, 0 for Bristol
    assert metrics["eval/percent_correct"] == 0.5
    assert len(server.requests) == 4 + 1 and all(body["temperature"] == 0.0 for body in server.requests)
