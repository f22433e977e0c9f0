"""sft_loader_server.py: SFT rows as schema-valid one-sequence groups, in process mode and served to
a real run-api that refuses anything off-schema (``--validation strict``)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from atroposlib.wire import ScoredData
from tests.environments.harness import ROOT, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference
from tests.helpers import ApiProcess

SCRIPT = "sft_loader_server.py"
FIXTURES = ROOT / "environments" / "fixtures" / "sft_loader"
# The loader never samples; serve mode is pointed at an address where nothing listens.
NO_INFERENCE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def idle_inference():
    """process mode refuses to start unless an inference server answers its health probe; this one
    answers and is never asked for a completion."""
    def never(prompt: str, index: int) -> str:
        raise AssertionError("the SFT loader asked for a completion")

    with ScriptedInference(never) as server:
        yield server.url


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def _groups(tmp_path: Path, inference: str, tokenizer_dir: Path, fixture: str, *flags: str,
            steps: int = 3) -> list[dict]:
    groups = process_groups(SCRIPT, tmp_path, inference, tokenizer_dir, "--env.train_file", str(FIXTURES / fixture),
                            *flags, steps=steps)
    assert len(groups) == steps
    for group in groups:
        ScoredData.model_validate(group)  # strict wire types: what /scored_data accepts
        assert len(group["tokens"]) == 1 and group["scores"] == [1.0]
        assert group["advantages"] == [[1.0] * len(group["tokens"][0])]
        assert group["overrides"] == [{"sft": True}] and group["group_overrides"] == {"sft": True, "group_size": 1}
        assert all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in group["messages"][0])
    return groups


def _trained(tokenizer, group: dict) -> str:
    return tokenizer.decode([t for t, m in zip(group["tokens"][0], group["masks"][0]) if m != -100])


def test_sharegpt_trains_on_every_assistant_turn(tmp_path: Path, idle_inference: str, tokenizer_dir: Path,
                                                 tokenizer) -> None:
    for group in _groups(tmp_path, idle_inference, tokenizer_dir, "sharegpt.jsonl", steps=6):
        trained = _trained(tokenizer, group)
        for message in group["messages"][0]:
            assert (message["content"] in trained) == (message["role"] == "assistant")


def test_oai_last_step_and_whole_conversation_masks(tmp_path: Path, idle_inference: str, tokenizer_dir: Path,
                                                    tokenizer) -> None:
    chat = ("--env.dataset_format", "oai_format", "--env.dataset_column_name", "messages")
    for group in _groups(tmp_path / "last", idle_inference, tokenizer_dir, "oai.jsonl", *chat,
                         "--env.mask_everything_but_last_step", "true", steps=6):
        messages = group["messages"][0]
        trained = _trained(tokenizer, group)
        assert messages[-1]["content"] in trained
        assert all(m["content"] not in trained for m in messages[:-1])
    for group in _groups(tmp_path / "all", idle_inference, tokenizer_dir, "oai.jsonl", *chat,
                         "--env.mask_everything_but_assistant_answer", "false"):
        assert group["masks"] == group["tokens"]


def test_completion_and_prefixed_completion(tmp_path: Path, idle_inference: str, tokenizer_dir: Path,
                                            tokenizer) -> None:
    for group in _groups(tmp_path / "plain", idle_inference, tokenizer_dir, "completion.jsonl",
                         "--env.dataset_format", "completion", "--env.dataset_column_name", "text"):
        assert group["masks"] == group["tokens"]
        assert tokenizer.decode(group["tokens"][0]) == group["messages"][0][0]["content"]
    for group in _groups(tmp_path / "prefix", idle_inference, tokenizer_dir, "prefix.jsonl", "--env.dataset_format", "prefix_completion",
                         "--env.dataset_column_name", "completion", "--env.prefix_column_name", "prompt"):
        prompt, completion = (m["content"] for m in group["messages"][0])
        assert _trained(tokenizer, group) == completion and group["masks"][0][0] == -100
        assert tokenizer.decode(group["tokens"][0]) == prompt + completion


def test_a_missing_column_is_named(tmp_path: Path, idle_inference: str, tokenizer_dir: Path) -> None:
    with pytest.raises(ValueError, match="column 'body' is not in the dataset \\(columns: text\\)"):
        process_groups(SCRIPT, tmp_path, idle_inference, tokenizer_dir, "--env.train_file",
                       str(FIXTURES / "completion.jsonl"), "--env.dataset_column_name", "body")


def test_serve_sends_groups_a_strict_run_api_accepts(tmp_path: Path, tokenizer_dir: Path, tokenizer) -> None:
    with ApiProcess(tmp_path / "api", "--validation", "strict") as api:
        trainer = {"wandb_group": None, "wandb_project": None, "batch_size": 4, "max_token_len": 4096,
                   "checkpoint_dir": "", "save_checkpoint_interval": -1, "starting_step": 0, "num_steps": 1}
        assert httpx.post(f"{api.url}/register", json=trainer).status_code == 200
        assert httpx.get(f"{api.url}/batch").json() == {"batch": None}  # the trainer has started
        # serve ends once the queue covers the run: 8 queued sequences at group_size 2, batch 4
        run_cli(SCRIPT, "serve", "--env.rollout_server_url", api.url, "--env.tokenizer_name", str(tokenizer_dir),
                "--env.train_file", str(FIXTURES / "sharegpt.jsonl"), "--env.group_size", "2",
                "--env.total_steps", "1", "--env.use_wandb", "false", "--env.max_sft_per_step", "-1",
                "--env.spool_dir", str(tmp_path / "spool"), "--openai.base_url", f"{NO_INFERENCE}/v1")
        batch = httpx.get(f"{api.url}/batch").json()["batch"]
        status = httpx.get(f"{api.url}/status").json()
    assert "refused" not in api.log().lower()
    assert sum(len(item["tokens"]) for item in batch) == 4
    for item in batch:
        assert item["overrides"] == [{"sft": True}] and item["group_overrides"]["sft"] is True
        assert json.dumps(item["messages"]).count('"role"') >= 2
        assert _trained(tokenizer, item).strip()
    assert status["queue_size"] >= 1  # the rest of what was sent waits for the next batch
