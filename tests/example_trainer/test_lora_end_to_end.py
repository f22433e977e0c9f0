"""The LoRA weight-bridge modes on the real engine, on a CPU. `atropos-grpo --weight-bridge-mode
lora_restart` trains two steps; the test posts each step's batch itself, only after it has asked
vLLM what it serves, so it sees the server of each restart: the fresh (no-op) adapter first, the
trained one after the restart. Into that server it then hot-swaps an adapter the way ``lora_only``
does, which must bring back the first answer."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from example_trainer.config import TrainingConfig
from example_trainer.weight_sync import LoraHotSwapSync
from tests.example_trainer.test_end_to_end import PROBE, processes_mentioning, stop
from tests.helpers import ApiProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.real_vllm, pytest.mark.timeout(900)]

QUESTION = "Name a colour."
ANSWERS = {" Blue.": 1.0, " Green.": 0.5, " I do not know any colours at all.": -0.5, " No.": -1.0}


class Trainer:
    """The `atropos-grpo` child and the vLLM it serves from."""

    def __init__(self, command: list[str], log_path: Path, vllm_port: int) -> None:
        self.log_path = log_path
        self.root = f"http://127.0.0.1:{vllm_port}"
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(command, cwd=log_path.parent, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_for_adapter(self, name: str, timeout: float = 300) -> None:
        """Until vLLM answers with adapter `name` active (the trainer must stay alive meanwhile)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the trainer exited with {self.process.returncode}:\n{self.log()}"
            try:
                active = httpx.get(self.root + "/lora/status", timeout=5).json()["active_adapter_path"]
            except (httpx.HTTPError, ValueError, KeyError):
                active = None
            if active and Path(active).name == name:
                return
            time.sleep(1.0)
        pytest.fail(f"vLLM did not serve {name} within {timeout:.0f} s:\n{self.log()}")

    def served_logprobs(self, token_ids: list[int]) -> list[float]:
        answer = httpx.post(self.root + "/generate", timeout=60, json={
            "prompt": {"prompt_token_ids": token_ids}, "max_tokens": 1, "prompt_logprobs": 0}).json()
        return [next(iter(position.values())) for position in answer["prompt_logprobs"] if position]


def scored_group(tokenizer: object) -> dict[str, object]:
    """Four answers to one question with unequal scores: every step moves the adapter."""
    prompt = tokenizer.encode(QUESTION)  # type: ignore[attr-defined]
    tokens, masks = [], []
    for answer in ANSWERS:
        completion = tokenizer.encode(answer, add_special_tokens=False)  # type: ignore[attr-defined]
        tokens.append(prompt + completion)
        masks.append([-100] * len(prompt) + completion)
    return {"tokens": tokens, "masks": masks, "scores": list(ANSWERS.values())}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiProcess]:
    with ApiProcess(tmp_path / "state") as server:
        yield server


def largest_change(before: list[float], after: list[float]) -> float:
    return max(abs(old - new) for old, new in zip(before, after, strict=True))


def test_lora_restart_serves_each_new_adapter_and_lora_only_hot_swaps(api: ApiProcess, real_model_dir: Path,
                                                                      tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    probe, group = tokenizer.encode(PROBE), scored_group(tokenizer)
    vllm_port, checkpoints = free_port(), tmp_path / "checkpoints"
    # lr 1e-3: one step moves the probe's logprobs well past vLLM's run-to-run noise
    command = [sys.executable, "-u", "-m", "example_trainer.grpo", "--model-name", str(real_model_dir),
               "--weight-bridge-mode", "lora_restart", "--training-steps", "2", "--vllm-restart-interval", "1",
               "--batch-size", "2", "--gradient-accumulation-steps", "2", "--seq-len", "64", "--max-model-len", "256",
               "--optimizer", "adamw", "--lr", "1e-3", "--vllm-port", str(vllm_port), "--atropos-url", api.url,
               "--save-path", str(checkpoints), "--log-dir", str(tmp_path / "logs")]
    trainer = Trainer(command, tmp_path / "trainer.log", vllm_port)
    try:
        trainer.wait_for_adapter("adapter_step_0")
        before = trainer.served_logprobs(probe)
        httpx.post(api.url + "/scored_data", json=group).raise_for_status()
        trainer.wait_for_adapter("adapter_step_1")  # on the restarted server
        after = trainer.served_logprobs(probe)
        assert largest_change(before, after) > 1e-3, "the restarted vLLM serves the first adapter's logprobs"
        # lora_only's hot-swap into the same server: the untrained adapter gives the first answer back
        config = TrainingConfig(model_name=str(real_model_dir), weight_bridge_mode="lora_only", vllm_port=vllm_port)
        LoraHotSwapSync(config, None).publish(str(checkpoints / "adapter_step_0"), 0)
        assert largest_change(before, trainer.served_logprobs(probe)) < 1e-4
        httpx.post(api.url + "/scored_data", json=group).raise_for_status()
        returncode = trainer.process.wait(300)
    finally:
        stop(trainer.process)
    assert returncode == 0, trainer.log()
    for name in ("adapter_step_0", "adapter_step_1", "adapter_step_2", "final_adapter"):
        assert (checkpoints / name / "adapter_config.json").exists(), name
        assert (checkpoints / name / "adapter_model.safetensors").exists(), name
    assert (checkpoints / "tokenizer" / "tokenizer_config.json").exists()
    assert httpx.get(api.url + "/status").json()["current_step"] == 2
    assert not processes_mentioning("vllm_api_server", str(vllm_port))
