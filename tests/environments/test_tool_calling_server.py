"""tool_calling_server.py offline: scripted replies with right, wrong, partial and malformed tool
calls against XLAM-style fixtures; the length penalty; short rollouts; evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from environments.tool_calling_server import extract_tool_calls, prompt_messages, split_conversation, tool_calls_match
from tests.environments.harness import ENVIRONMENTS, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

FIXTURES = ENVIRONMENTS / "fixtures" / "tool_calling"
TRAIN, TEST = str(FIXTURES / "train.jsonl"), str(FIXTURES / "test.jsonl")


def rows(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def gold_of(row: dict) -> tuple[str, list[dict]]:
    """(user request, gold calls) of a fixture row."""
    _, human, gpt = split_conversation(row["conversations"])
    return human, extract_tool_calls(gpt)


def blocks(calls: list) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in calls)


def with_extra_argument(calls: list[dict]) -> list[dict]:
    first = {**calls[0], "arguments": {**calls[0]["arguments"], "verbose": True}}
    return [first] + calls[1:]


def with_wrong_value(calls: list[dict]) -> list[dict]:
    name, value = next(iter(calls[0]["arguments"].items()))
    wrong = "something else" if value != "something else" else "other"
    return [{**calls[0], "arguments": {**calls[0]["arguments"], name: wrong}}] + calls[1:]


# Variant k of a reply (choice k): (text, expected score).
def variants(calls: list[dict]) -> list[tuple[str, float]]:
    think = "<think>variant {k}: I should call the matching tool with the values the user gave.</think>\n"
    single_quoted = "<tool_call>\n" + str(calls[0]) + "\n</tool_call>"  # Python repr, not JSON
    return [(think.format(k=k) + body, score) for k, (body, score) in enumerate([
        (blocks(calls), 1.0),                                                       # exactly the gold calls
        (blocks(with_extra_argument(calls)), 1.0),                                  # extra arguments are allowed
        (blocks(list(reversed(calls))), 1.0),                                       # order does not matter
        (blocks(with_wrong_value(calls)), -1.0),                                    # a wrong argument value
        (blocks(calls + [{"name": "get_weather", "arguments": {"city": "Oslo"}}]), -1.0),  # an extra call
        (blocks(calls[:-1]) if len(calls) > 1 else "I would rather not call anything.", -1.0),  # a missing call
        ("<tool_call>\n{name: broken json}\n</tool_call>" if len(calls) > 1 else single_quoted, -1.0),
        ("The answer is that you should ask someone else about it.", -1.0),       # no call at all
    ])]


@pytest.fixture
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_tool_call_matching_rules() -> None:
    gold = blocks([{"name": "f", "arguments": {"a": 1, "b": {"c": 2}}}])
    assert tool_calls_match(blocks([{"name": "f", "arguments": {"b": {"c": 2}, "a": 1, "z": 0}}]), gold)
    assert not tool_calls_match(blocks([{"name": "f", "arguments": {"a": 1}}]), gold)
    assert not tool_calls_match(blocks([{"name": "g", "arguments": {"a": 1, "b": {"c": 2}}}]), gold)
    assert not tool_calls_match("<tool_call>{\"name\": \"f\"", gold)  # unclosed block: no call
    assert tool_calls_match("bad <tool_call>nope</tool_call> " + gold, gold)  # unparsable blocks are skipped
    assert not tool_calls_match(gold, "no gold call")


def test_process_scores_each_kind_of_tool_call(tokenizer_dir: Path, tmp_path: Path, tokenizer) -> None:
    script = {}
    for row in rows(TRAIN):
        human, calls = gold_of(row)
        script[human] = variants(calls)
    bmi_request = next(h for h in script if "BMI" in h)

    def answer(prompt: str, index: int) -> str:
        human = next(h for h in script if h in prompt)
        if human == bmi_request and index == 7:
            return "ok"  # too few tokens to train on: the group comes up short and is dropped
        return script[human][index][0]

    with ScriptedInference(answer, tokenizer) as server:
        groups = process_groups("tool_calling_server.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", TRAIN, "--env.test_file", TEST,
                                steps=7, group_size=8)
    assert len(groups) == 7
    seen = set()
    for group in groups:
        human = group["messages"][0][1]["content"]
        seen.add(human)
        assert group["messages"][0][0]["role"] == "system" and "<think>" in group["messages"][0][0]["content"]
        expected = {text: score for text, score in script[human]}
        assert sorted(group["scores"]) == sorted(expected.values())
        for chat, score in zip(group["messages"], group["scores"]):
            assert score == expected[chat[-1]["content"]], chat[-1]["content"]
    assert bmi_request not in seen and len(seen) == 7
    # One completion request (n = group_size, temperature 0.8, 15360 new tokens) per item, on the
    # chat-templated prompt.
    assert all(body["n"] == 8 and body["temperature"] == 0.8 and body["max_tokens"] == 15360
               and body["prompt"].endswith("<|assistant|>") for body in server.requests)


def test_length_penalty_when_every_call_is_right(tokenizer_dir: Path, tmp_path: Path, tokenizer) -> None:
    row = rows(TRAIN)[0]
    one_row = tmp_path / "one.jsonl"
    one_row.write_text(json.dumps(row) + "\n")
    system, human, gpt = split_conversation(row["conversations"])
    prompt = tokenizer.apply_chat_template(prompt_messages(system, human), add_generation_prompt=True, tokenize=False)
    prompt_tokens = len(tokenizer.encode(prompt, add_special_tokens=False))
    correct = blocks(extract_tool_calls(gpt))
    short_tokens = len(tokenizer.encode("<think>short</think>\n" + correct + "<|end|>", add_special_tokens=False))
    max_length = 2 * (prompt_tokens + short_tokens + 10)  # no penalty for the short reply
    replies = ["<think>short</think>\n" + correct, "<think>" + "let me think " * 40 + "</think>\n" + correct,
               "<think>" + "and more thinking " * 400 + "</think>\n" + correct]

    with ScriptedInference(lambda prompt, index: replies[index], tokenizer) as server:
        groups = process_groups("tool_calling_server.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", str(one_row), "--env.max_token_length", str(max_length),
                                steps=1, group_size=3)
    assert len(groups) == 1
    scores = dict(zip((chat[-1]["content"] for chat in groups[0]["messages"]), groups[0]["scores"]))
    lengths = dict(zip((chat[-1]["content"] for chat in groups[0]["messages"]), map(len, groups[0]["tokens"])))
    threshold = max_length / 2
    assert scores[replies[0]] == 1.0 and scores[replies[2]] == 0.0
    assert lengths[replies[1]] > threshold
    assert scores[replies[1]] == pytest.approx(1 - (lengths[replies[1]] - threshold) / (max_length - threshold))
    # A short max_token_length also bounds the new tokens asked for.
    assert [body["max_tokens"] for body in server.requests] == [max_length - prompt_tokens]


def test_evaluate_scores_one_sample_per_held_out_conversation(tokenizer_dir: Path, tmp_path: Path, tokenizer) -> None:
    script = {}
    for k, row in enumerate(rows(TEST)):
        human, calls = gold_of(row)
        script[human] = "<think>ok</think>\n" + (blocks(calls) if k % 2 == 0 else blocks(with_wrong_value(calls)))

    def answer(prompt: str, index: int) -> str:
        return next(reply for human, reply in script.items() if human in prompt)

    out = tmp_path / "evals"
    with ScriptedInference(answer, tokenizer) as server:
        run_cli("tool_calling_server.py", "evaluate", "--env.tokenizer_name", str(tokenizer_dir),
                "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted", "--openai.api_key", "x",
                "--env.use_wandb", "false", "--env.train_file", TRAIN, "--env.test_file", TEST,
                "--env.data_dir_to_save_evals", str(out))
    metrics = json.loads((out / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/percent_correct"] == 0.5
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and sum(sample["correct"] for sample in samples) == 2
    assert all(body["temperature"] == 1.0 and body["n"] == 1 for body in server.requests)
