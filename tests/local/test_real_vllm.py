"""Inference clients, process and serve against the real vLLM engine (CPU build, SmolLM2)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import transformers

from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.local.vllm_service import LocalVLLM
from tests.conftest import registration
from tests.doc_commands import readme_arguments
from tests.helpers import ApiProcess, free_port
from tests.local.stand_ins import ipc_folder_of, killed_at_exit, signal_and_read, wait_until
from tests.real_engine import ROOT, assert_engine_core_forked_and_running_the_model

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]
QUESTION = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]


def _manager(server: LocalVLLM) -> ServerManager:
    config = APIServerConfig(base_url=server.base_url, model_name=server.served_name, server_type="vllm",
                             tokenizer_name=str(server.model_dir), timeout=120)
    return ServerManager(configs=[config])


def test_managed_server_tracks_real_tokens_masks_and_logprobs(real_vllm: LocalVLLM) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(real_vllm.model_dir)
    manager = _manager(real_vllm)

    async def scenario() -> tuple[Any, list[Any], list[dict[str, Any]]]:
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            response = await managed.chat_completion(messages=QUESTION, n=3, max_tokens=24, temperature=1.0, seed=7)
            nodes = managed.get_state()["nodes"]
        rescored = [await manager.get_logprobs(input_ids=node.tokens, top_k=1) for node in nodes]
        await manager.close()
        return response, nodes, rescored

    response, nodes, rescored = asyncio.run(scenario())
    prompt = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert len(nodes) == 3
    for choice, node, scores in zip(response.choices, nodes, rescored):
        prompt_length = node.masked_tokens.count(-100)
        assert prompt_length == len(tokenizer.encode(prompt, add_special_tokens=False))
        assert node.masked_tokens[:prompt_length] == [-100] * prompt_length
        assert node.masked_tokens[prompt_length:] == node.tokens[prompt_length:]
        assert tokenizer.decode(node.tokens) == prompt + tokenizer.decode(node.tokens[prompt_length:])
        assert tokenizer.decode(node.tokens[prompt_length:], skip_special_tokens=True) == choice.message.content
        completion_logprobs = node.logprobs[prompt_length:]
        assert node.logprobs[:prompt_length] == [1.0] * prompt_length
        assert len(completion_logprobs) == len(node.tokens) - prompt_length
        assert all(lp <= 0 for lp in completion_logprobs)
        # the sampler's logprob of each completion token matches a prompt_logprobs re-score
        ids, logprobs = scores["prompt_topk_token_ids"], scores["prompt_topk_logprobs"]
        for position, sampled in enumerate(completion_logprobs, start=prompt_length):
            token = node.tokens[position]
            assert token in ids[position]
            assert logprobs[position][ids[position].index(token)] == pytest.approx(sampled, abs=0.05)


def test_openai_routes_return_n_choices_and_token_ids(real_vllm: LocalVLLM) -> None:
    answer = httpx.post(real_vllm.base_url + "/chat/completions", timeout=120, json={
        "model": real_vllm.served_name, "messages": QUESTION, "n": 4, "max_tokens": 8, "logprobs": True,
        "return_token_ids": True}).json()
    assert len(answer["choices"]) == 4 and all(c["token_ids"] for c in answer["choices"])


def _gsm8k_flags(server: LocalVLLM, data: Path) -> list[str]:
    return ["--env.train_file", str(data / "train.jsonl"), "--env.test_file", str(data / "test.jsonl"),
            "--env.group_size", "4", "--env.max_token_length", "48", "--env.use_wandb", "false",
            *server.openai_flags()]


def test_process_mode_writes_real_rollouts(real_vllm: LocalVLLM, gsm8k_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "gsm8k.jsonl"
    command = [sys.executable, str(ROOT / "environments" / "gsm8k_server.py"), "process", "--env.total_steps", "3",
               "--env.data_path_to_save_groups", str(out), *_gsm8k_flags(real_vllm, gsm8k_data)]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 3 and out.with_suffix(".html").exists()
    for group in groups:
        assert len(group["tokens"]) == 4 and all(-1.0 <= score <= 1.0 for score in group["scores"])
        for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
            assert len(tokens) == len(masks) == len(logprobs) and masks[0] == -100 and masks[-1] == tokens[-1]


def test_serve_mode_feeds_a_trainer_through_real_vllm(real_vllm: LocalVLLM, gsm8k_data: Path, tmp_path: Path) -> None:
    with ApiProcess(tmp_path / "state") as api:
        httpx.post(api.url + "/register", json=registration(4)).raise_for_status()
        httpx.get(api.url + "/batch")
        command = [sys.executable, str(ROOT / "environments" / "gsm8k_server.py"), "serve",
                   "--env.rollout_server_url", api.url, "--env.total_steps", "100", "--env.steps_per_eval", "-1",
                   "--env.spool_dir", str(tmp_path / "spool"), "--env.ensure_scores_are_not_same", "false",
                   *_gsm8k_flags(real_vllm, gsm8k_data)]
        log = open(tmp_path / "env.log", "wb")
        env = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            batch = None
            deadline = time.monotonic() + 300
            while batch is None and time.monotonic() < deadline:
                batch = httpx.get(api.url + "/batch").json()["batch"]
                time.sleep(0.5)
            assert batch, (tmp_path / "env.log").read_text()[-3000:]
            assert all(len(group["tokens"]) == 4 and group["inference_logprobs"] for group in batch)
        finally:
            env.send_signal(signal.SIGTERM)
            assert env.wait(120) == 0, (tmp_path / "env.log").read_text()[-3000:]


def _prompt_logprobs(server: LocalVLLM, ids: list[int]) -> list[float]:
    answer = httpx.post(server.base_url + "/completions", timeout=120, json={
        "model": server.served_name, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}).json()
    return [next(iter(entry.values()))["logprob"] for entry in answer["choices"][0]["prompt_logprobs"][1:]]


def test_the_engine_core_is_forked_from_the_server_and_runs_the_model(real_vllm: LocalVLLM) -> None:
    assert real_vllm.process is not None
    assert_engine_core_forked_and_running_the_model(real_vllm.process.pid)


def test_new_weights_are_served_without_a_restart(real_vllm: LocalVLLM, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    changed = tmp_path / "changed"
    shutil.copytree(real_vllm.model_dir, changed)
    weights = load_file(changed / "model.safetensors")
    norm = weights["model.norm.weight"]
    weights["model.norm.weight"] = norm * torch.tensor(0.25, dtype=norm.dtype)
    save_file(weights, changed / "model.safetensors", metadata={"format": "pt"})
    ids = transformers.AutoTokenizer.from_pretrained(real_vllm.model_dir).encode("The capital of France is Paris.")
    before = _prompt_logprobs(real_vllm, ids)
    try:
        assert real_vllm.reload_weights(changed) < 60
        after = _prompt_logprobs(real_vllm, ids)
        assert max(abs(a - b) for a, b in zip(before, after)) > 0.1
    finally:
        real_vllm.reload_weights(real_vllm.model_dir)
    assert _prompt_logprobs(real_vllm, ids) == pytest.approx(before, abs=1e-3)


def _process_group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members


def test_sigterm_to_the_real_wrapper_stops_every_vllm_process(real_model_dir: Path, tmp_path: Path) -> None:
    # the README's command (its default model is real_model_dir), on a free port
    serve = readme_arguments("console-tools", "atropos-vllm serve", {"9001": str(free_port())})
    command = [sys.executable, "-m", "atroposlib.local.vllm_service", "serve", *serve]
    wrapper = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with killed_at_exit(wrapper):
        assert wrapper.stdout is not None
        lines = [wrapper.stdout.readline() for _ in range(4)]
        assert lines[1].strip().startswith("dtype: ") and "vLLM is up at" in lines[3], lines
        children = Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text().split()
        vllm_group = int(children[0])  # vLLM leads a process group of its own
        assert len(_process_group_members(vllm_group)) >= 2  # the API server and its engine
        sockets = ipc_folder_of(vllm_group)
        assert any(path.is_socket() for path in sockets.iterdir()), "vLLM made no sockets in its own folder"
        output = signal_and_read(wrapper, signal.SIGTERM, timeout=120)
    assert wrapper.returncode == 0 and "stopped by SIGTERM: vLLM stopped" in output, output
    wait_until(lambda: _process_group_members(vllm_group) == [], timeout=10)  # SIGKILLed ones take a moment
    assert not sockets.exists()
