"""The importance ratio against the real engine: the trainer's log-probabilities of the tokens
vLLM sampled equal the groups' ``inference_logprobs`` at the sampling temperature and
truncation, before and after the trainer's weights are reloaded into the server in place.

An environment using ``managed_server()`` runs in process mode against the trainer's bundled
vLLM server and against ``atropos-vllm serve`` (both SmolLM2-135M in float32); its groups are
prepared as the trainer prepares a batch, and the trainer's model (float32) scores them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.process_mode import process
from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.local.vllm_service import LocalVLLM
from atroposlib.policy_version import POLICY_VERSION_HEADER
from example_trainer.checkpointing import save_checkpoint
from example_trainer.config import TrainingConfig
from example_trainer.data import LABEL_PAD, prepare_batch
from example_trainer.model import load_model_and_tokenizer
from example_trainer.training import create_optimizer, run_training_step, token_logprobs
from example_trainer.vllm_manager import TrainerVLLM

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]
QUESTION = [{"role": "user", "content": "Write a short sentence about the sea."}]
ALIGNED = 0.02  # mean |trainer - sampler| in nats the issue allows in float32
TRUNCATED_SETTINGS = [(1.0, 1.0), (0.7, 1.0), (0.7, 0.9)]


class SampleEnv(BaseEnv):
    """One group of `group_size` answers to `QUESTION` per item, sampled with `sampling` through
    `managed_server()`, as GRPO environments written for Atropos do."""

    name = "alignment"

    def __init__(self, config: BaseEnvConfig, servers: list[APIServerConfig], sampling: dict[str, Any]) -> None:
        super().__init__(config, servers)
        self.sampling = sampling

    async def setup(self) -> None:
        pass

    async def get_next_item(self) -> dict[str, Any]:
        return {"messages": QUESTION}

    async def collect_trajectories(self, item: Any) -> tuple[dict[str, Any], list[Any]]:
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            await managed.chat_completion(messages=QUESTION, n=self.config.group_size, max_tokens=24, **self.sampling)
            nodes = managed.get_state()["nodes"]
        return {"tokens": [node.tokens for node in nodes], "masks": [node.masked_tokens for node in nodes],
                "inference_logprobs": [node.logprobs for node in nodes],
                "scores": [float(i) for i in range(len(nodes))]}, []


def sampled_group(base_url: str, model_dir: Path, tmp_path: Path, sampling: dict[str, Any]) -> dict[str, Any]:
    """The group a process-mode run of `SampleEnv` writes, sampled by the server at `base_url`."""
    out = tmp_path / f"groups-{len(list(tmp_path.glob('groups-*')))}.jsonl"
    config = BaseEnvConfig(tokenizer_name=str(model_dir), use_wandb=False, total_steps=1, group_size=4,
                           ensure_scores_are_not_same=False, data_path_to_save_groups=str(out))
    server = APIServerConfig(base_url=base_url, model_name="smollm2", api_key="x", server_type="vllm",
                             tokenizer_name=str(model_dir), timeout=300)
    asyncio.run(process(SampleEnv(config, [server], sampling)))
    [group] = [json.loads(line) for line in out.read_text().splitlines()]
    return group


@pytest.fixture(scope="module")
def trainer_model(real_model_dir: Path) -> tuple[torch.nn.Module, TrainingConfig]:
    config = TrainingConfig(model_name=str(real_model_dir), dtype="float32", device="cpu", optimizer="adamw",
                            lr=2e-4, gradient_accumulation_steps=1, batch_size=4)
    model, _ = load_model_and_tokenizer(config)
    return model, config


def misalignment(model: torch.nn.Module, group: dict[str, Any], match_truncation: bool = True) -> float:
    """Mean |trainer - sampler| log-probability over the group's sampled tokens."""
    micro = prepare_batch([group], 8, pad_multiple=1).micro_batches[0]
    with torch.no_grad():
        trainer = token_logprobs(model, micro, match_truncation)
    trained = micro.labels != LABEL_PAD
    assert micro.inference_logprobs is not None and int(trained.sum()) > 10
    return float((trainer[trained] - micro.inference_logprobs[trained]).abs().mean())


@pytest.mark.parametrize("temperature,top_p", TRUNCATED_SETTINGS)
def test_the_bundled_servers_logprobs_are_the_trainers_at_the_sampling_settings(
        served: TrainerVLLM, real_model_dir: Path, trainer_model: Any, tmp_path: Path,
        temperature: float, top_p: float) -> None:
    model, _ = trainer_model
    served.reload_weights(str(real_model_dir), policy_version=0)  # another test may have left other weights
    group = sampled_group(served.base_url, real_model_dir, tmp_path, {"temperature": temperature, "top_p": top_p})
    assert group["generation_params"] == {"temperature": temperature, "top_p": top_p, "policy_version": 0}
    assert misalignment(model, group) <= ALIGNED
    if temperature != 1.0:  # the check has teeth: the T=1 distribution (raw logprobs) is far off
        assert misalignment(model, {**group, "generation_params": {"top_p": top_p}}) > 5 * ALIGNED
    if top_p < 1.0:  # and scoring under the untruncated distribution is measurably off too
        assert misalignment(model, group, match_truncation=False) > misalignment(model, group)


def test_atropos_vllm_serve_reports_the_sampled_distributions_logprobs_and_its_version(
        real_vllm: LocalVLLM, real_model_dir: Path, trainer_model: Any, tmp_path: Path) -> None:
    model, _ = trainer_model
    assert real_vllm.dtype.dtype == "float32"
    real_vllm.reload_weights(real_model_dir, policy_version=0)  # another test may have left other weights
    group = sampled_group(real_vllm.base_url, real_model_dir, tmp_path, {"temperature": 0.7, "top_p": 0.9})
    assert group["generation_params"] == {"temperature": 0.7, "top_p": 0.9, "policy_version": 0}
    assert misalignment(model, group) <= ALIGNED
    root = real_vllm.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/v1/models").headers[POLICY_VERSION_HEADER] == "0"


def test_after_an_in_place_reload_the_served_logprobs_are_the_trained_weights(
        served: TrainerVLLM, real_model_dir: Path, trainer_model: Any, tmp_path: Path) -> None:
    model, config = trainer_model
    served.reload_weights(str(real_model_dir), policy_version=0)
    sampling = {"temperature": 0.7}
    before = sampled_group(served.base_url, real_model_dir, tmp_path, sampling)
    trained, tokenizer = load_model_and_tokenizer(config)  # a second copy: the other tests keep the first
    optimizer = create_optimizer(trained, config)
    batch = prepare_batch([before], config.batch_size, pad_multiple=1)
    for step in range(3):  # big enough steps that old and new weights score tokens clearly apart
        run_training_step(trained, optimizer, batch, config.model_copy(update={"lr": 1e-3}), step)
    checkpoint = save_checkpoint(trained, tokenizer, str(tmp_path / "checkpoints"), 3)
    log_lines = len(served.log_path.read_text(errors="replace").splitlines())
    served.reload_weights(checkpoint, policy_version=3)
    try:
        after = sampled_group(served.base_url, real_model_dir, tmp_path, sampling)
    finally:  # the session's other tests expect the starting weights
        served.reload_weights(str(real_model_dir), policy_version=0)
    assert after["generation_params"]["policy_version"] == 3
    assert misalignment(trained, after) <= ALIGNED  # the server samples from the new weights, LM head included
    assert misalignment(model, after) > 5 * ALIGNED  # which the starting weights score differently
    reload_log = served.log_path.read_text(errors="replace").splitlines()[log_lines:]
    assert not [line for line in reload_log if "Failed to load weights" in line]
