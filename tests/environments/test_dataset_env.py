"""dataset_environment/: DatasetEnv scored by registry rewards, its YAML configs, the local runner
and the launcher, offline against the scripted inference server and the project's fixture."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import pytest
from transformers import AutoTokenizer

from atroposlib.envs.cli import resolve_settings
from atroposlib.envs.reward_fns import registry
from environments.dataset_environment import dataset_local_server, launch_local_dataset_run
from environments.dataset_environment.dataset_env import DatasetEnv, config_from_yaml
from tests.environments.harness import ROOT, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

SCRIPT = "dataset_environment/dataset_env.py"
FIXTURES = ROOT / "environments" / "fixtures" / "dataset"
TRAIN = FIXTURES / "train.jsonl"
TEST = FIXTURES / "test.jsonl"


def _golds(path: Path) -> dict[str, str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["question"]: row["answer"].split("####")[-1].strip().replace(",", "") for row in rows}


GOLDS = {**_golds(TRAIN), **_golds(TEST)}


def _gold_in(prompt: str) -> int:
    return next(int(gold) for question, gold in GOLDS.items() if question in prompt)


def four_kinds(prompt: str, index: int) -> str:
    """Choice 0: right with <think>; 1: right without; 2: wrong with <think>; 3: wrong without."""
    gold = _gold_in(prompt)
    return [f"<think>working it out</think> so it is \\boxed{{{gold}}}", f"It is \\boxed{{{gold}}}.",
            f"<think>a slip somewhere</think> \\boxed{{{gold + 1}}}", "I do not know the answer here."][index % 4]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def _run(tmp_path: Path, tokenizer_dir: Path, tokenizer, answer: Callable[[str, int], str], *flags: str,
         steps: int = 2, group_size: int = 4) -> tuple[list[dict], list[dict]]:
    with ScriptedInference(answer, tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.dataset_path", str(TRAIN),
                                *flags, steps=steps, group_size=group_size)
    return groups, server.requests


def test_default_rewards_weigh_accuracy_and_think_format(tmp_path: Path, tokenizer_dir: Path, tokenizer) -> None:
    groups, requests = _run(tmp_path, tokenizer_dir, tokenizer, four_kinds)
    assert len(groups) == 2
    for group in groups:
        # accuracy (weight 1.0) and format (0.2), normalised by the weights' sum
        assert group["scores"] == pytest.approx([1.0, 1.0 / 1.2, 0.2 / 1.2, 0.0])
        for tokens, masks, messages in zip(group["tokens"], group["masks"], group["messages"]):
            trained = [t for t, m in zip(tokens, masks) if m != -100]
            assert masks[0] == -100 and trained
            assert messages[-1]["content"] in tokenizer.decode(trained)
    assert all(r["n"] == 4 and r["temperature"] == 0.7 and r["top_p"] == 0.9 for r in requests)
    assert requests[0]["prompt"].endswith("<|assistant|>")  # the generation prompt, through /v1/completions


def test_prefill_legacy_reward_names_and_ground_truth_field(tmp_path: Path, tokenizer_dir: Path, tokenizer) -> None:
    def answer(prompt: str, index: int) -> str:  # the model continues after the prefilled "<think>\n"
        gold = _gold_in(prompt)
        return [f"add them</think> \\boxed{{{gold}}}", f"hmm</think> \\boxed{{{gold + 3}}}"][index % 2]

    groups, requests = _run(tmp_path, tokenizer_dir, tokenizer, answer, "--env.prefill", "<think>\n",
                            "--env.reward_functions", "[]", "--env.reward_funcs", "accuracy_reward,format_reward",
                            "--env.ground_truth_field", "answer", "--env.answer_field", "None", group_size=2)
    assert requests[0]["prompt"].endswith("<|assistant|><think>\n")
    for group in groups:
        assert group["scores"] == [2.0, 1.0]  # legacy names are summed: accuracy + format
        response = group["messages"][0][-1]["content"]
        assert response.startswith("<think>\nadd them</think>")
        trained = tokenizer.decode([t for t, m in zip(group["tokens"][0], group["masks"][0]) if m != -100])
        assert "add them" in trained and "<think>" not in trained  # the prefill is prompt, not trained on


def test_length_warmup_grows_the_generation_budget(tmp_path: Path, tokenizer_dir: Path, tokenizer) -> None:
    _, requests = _run(tmp_path, tokenizer_dir, tokenizer, four_kinds, "--env.length_warmup_steps", "2",
                       "--env.min_tokens", "100", "--env.max_tokens", "300", "--env.process_concurrency", "1",
                       steps=3)
    assert [r["max_tokens"] for r in requests] == [100, 200, 300]


def test_evaluate_scores_the_eval_split(tmp_path: Path, tokenizer_dir: Path, tokenizer) -> None:
    with ScriptedInference(lambda prompt, i: f"<think>ok</think> \\boxed{{{_gold_in(prompt)}}}", tokenizer) as server:
        run_cli(SCRIPT, "evaluate", "--env.tokenizer_name", str(tokenizer_dir), "--env.use_wandb", "false",
                "--env.eval_dataset_path", str(TEST), "--env.dataset_path", str(TRAIN),
                "--env.data_dir_to_save_evals", str(tmp_path / "eval"), "--openai.base_url", f"{server.url}/v1",
                "--openai.model_name", "scripted", "--openai.tokenizer_name", str(tokenizer_dir))
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert metrics == {"eval/mean_score": 1.0, "eval/max_score": 1.0, "eval/min_score": 1.0}
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and {s["messages"][1]["content"] for s in samples} == set(_golds(TEST))


def test_shipped_configs_load_with_resolvable_rewards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    gsm8k, servers = config_from_yaml("gsm8k")
    assert (gsm8k.dataset_name, gsm8k.dataset_config, gsm8k.group_size, gsm8k.batch_size) == ("gsm8k", "main", 8, 1024)
    assert [r["type"] for r in gsm8k.reward_functions] == [
        "r1", "cosine_scaled", "accuracy", "format", "reasoning_steps", "repetition_penalty"]
    assert (gsm8k.max_tokens, gsm8k.length_warmup_steps, gsm8k.min_tokens, gsm8k.eval_split) == (16000, 100, 2048, "test")
    debug, _ = config_from_yaml("gsm8k_debug.yaml")
    assert debug.reward_funcs == ["accuracy_reward", "format_reward"] and debug.group_size == 1
    local, local_servers = config_from_yaml(str(ROOT / "environments/dataset_environment/configs/dataset_local.yaml"))
    assert local.prefill == "<think>\n" and local.total_steps == 1
    assert [r["weight"] for r in local.reward_functions] == [1.0, 0.2]
    assert local_servers[0].model_name == "gpt-4.1-nano" and local_servers[0].api_key == "sk-from-the-environment"
    for config in (gsm8k, debug, local):
        for reward in config.reward_functions or config.reward_funcs:
            registry.get(reward["type"] if isinstance(reward, dict) else reward)
    with pytest.raises(FileNotFoundError, match="gsm8k_debug"):
        config_from_yaml("no_such_config")


def test_local_server_runs_a_yaml_config(tmp_path: Path, tokenizer_dir: Path, tokenizer,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    with ScriptedInference(four_kinds, tokenizer) as server:
        monkeypatch.setenv("SCRIPTED_URL", f"{server.url}/v1")
        config = tmp_path / "offline.yaml"
        config.write_text(
            f"tokenizer_name: {tokenizer_dir}\ngroup_size: 4\nuse_wandb: false\n"
            f"dataset:\n  dataset_name: gsm8k\n  dataset_path: {TRAIN}\n  prompt_field: question\n"
            "  answer_field: answer\n  shuffle_dataset: false\n  reward_functions: [accuracy]\n"
            "server_configs:\n  - model_name: scripted\n    base_url: ${SCRIPTED_URL}\n")
        with pytest.raises(SystemExit) as ended:
            dataset_local_server.main(["--config", str(config), "--items", "2"])
    assert ended.value.code == 0
    out = capsys.readouterr().out
    assert out.count("scores: [1.0, 1.0, 0.0, 0.0]") == 2 and "=== 2/2 items scored" in out
    assert "A baker makes 12 muffins" in out and "#### 27" in out


def test_local_server_names_a_missing_config() -> None:
    with pytest.raises(SystemExit, match="no dataset config 'nope'"):
        dataset_local_server.main(["--config", "nope"])


def test_launcher_commands_fit_the_environment_cli_and_the_trainer() -> None:
    settings = resolve_settings(DatasetEnv, launch_local_dataset_run.env_command()[2:])
    env = settings.env_config
    assert settings.mode == "serve" and env.reward_functions == ["repetition_penalty"]
    assert (env.dataset_name, env.dataset_config, env.split) == (
        "HuggingFaceH4/testing_self_instruct_process_essays", None, "train[:100]")
    assert env.eval_dataset_name is None and env.system_prompt is None
    assert settings.server_configs[0].base_url == "http://127.0.0.1:9001/v1"
    config = launch_local_dataset_run.trainer_config()
    assert (config.model_name, config.vllm_port, config.seq_len) == ("Qwen/Qwen2.5-1.5B-Instruct", 9001, 512)
    assert config.atropos_url == "http://127.0.0.1:8000"
    assert re.search(r"atroposlib\.cli\.run_api --host 127\.0\.0\.1 --port 8000$",
                     " ".join(launch_local_dataset_run.api_command()))
