"""A group's prompt through the model once: the layout, and the same log-probabilities and
gradients as the rows run whole."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from example_trainer.config import TrainingConfig
from example_trainer.data import LABEL_PAD, PreparedBatch, prepare_batch
from example_trainer.logprobs import sampled_token_logprobs
from example_trainer.model import enable_gradient_checkpointing
from example_trainer.prefix_sharing import shared_prefix_length
from example_trainer.training import loss_settings, micro_batch_loss, step_totals

PROMPT = 48  # 4 rows sharing 47 positions save 141: enough to pay for the prefix's own pass


def groups(count: int = 3, size: int = 4, seed: int = 0, vocab: int = 200, prompt_length: int = PROMPT
           ) -> list[dict[str, Any]]:
    """`count` groups of `size` rollouts: one prompt per group, answers of 2 to 9 tokens."""
    rng = random.Random(seed)
    items = []
    for _ in range(count):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_length)]
        answers = [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))] for _ in range(size)]
        items.append({"tokens": [prompt + answer for answer in answers],
                      "masks": [[LABEL_PAD] * prompt_length + answer for answer in answers],
                      "scores": [float(rng.random() > 0.5) for _ in answers],
                      "generation_params": {"temperature": 0.7}})
    return items


def test_the_shared_prefix_is_the_common_untrained_start() -> None:
    tokens = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 1, 0]])
    labels = torch.full_like(tokens, LABEL_PAD)
    assert shared_prefix_length(tokens, labels, LABEL_PAD) == 3
    labels[1, 1] = 7  # a trained position ends what may be skipped
    assert shared_prefix_length(tokens, labels, LABEL_PAD) == 1
    assert shared_prefix_length(tokens[:1], labels[:1], LABEL_PAD) == 0  # one row: nothing to share
    same = torch.tensor([[4, 4, 4], [4, 4, 4]])
    assert shared_prefix_length(same, torch.full_like(same, LABEL_PAD), LABEL_PAD) == 2  # a position is left


def test_micro_batches_keep_to_one_group_and_compute_fewer_positions() -> None:
    items = groups(count=3, size=4)
    packed = prepare_batch(items, 4, pad_multiple=1, pack=True)
    shared = prepare_batch(items, 4, pad_multiple=1, pack=True, share_prefix=True)
    assert [m.shared_prefix for m in shared.micro_batches] == [PROMPT - 1] * 3  # the label of the prompt's last
    for micro, item in zip(shared.micro_batches, items):                        # token is the first answer token
        assert sorted(micro.tokens[:, :PROMPT].tolist()) == sorted(row[:PROMPT] for row in item["tokens"])
    assert shared.positions < packed.positions
    assert (shared.num_sequences, shared.num_tokens) == (packed.num_sequences, packed.num_tokens)


def test_rollouts_with_no_one_to_share_with_are_packed_together() -> None:
    items = groups(count=2, size=5)  # micro-batches of 4: each group leaves one rollout alone
    batch = prepare_batch(items, 4, pad_multiple=1, pack=True, share_prefix=True)
    assert [m.size for m in batch.micro_batches] == [4, 4, 2]
    assert [m.shared_prefix for m in batch.micro_batches] == [PROMPT - 1, PROMPT - 1, 0]
    singletons = groups(count=4, size=1)
    assert prepare_batch(singletons, 4, pad_multiple=1, pack=True, share_prefix=True).positions == \
        prepare_batch(singletons, 4, pad_multiple=1, pack=True).positions


def test_a_prefix_too_short_to_pay_for_its_own_pass_is_not_shared() -> None:
    items = groups(count=3, size=4, prompt_length=12)  # 3 x 11 positions saved per micro-batch: too few
    shared = prepare_batch(items, 4, pad_multiple=1, pack=True, share_prefix=True)
    assert [m.shared_prefix for m in shared.micro_batches] == [0, 0, 0]
    assert shared.positions == prepare_batch(items, 4, pad_multiple=1, pack=True).positions


def test_sharing_is_refused_over_several_ranks() -> None:
    with pytest.raises(ValueError, match="not split over ranks"):
        prepare_batch(groups(), 4, share_prefix=True, rank=0, world_size=2)


def gradients(model: torch.nn.Module, batch: PreparedBatch, config: TrainingConfig) -> tuple[list[float], dict]:
    """The step's loss gradient (as `run_training_step` accumulates it) and each rollout's summed logp."""
    model.zero_grad()
    logps = []
    for micro in batch.micro_batches:
        loss, _ = micro_batch_loss(model, micro, loss_settings(config), step_totals(batch, config))
        loss.backward()
        with torch.no_grad():
            logps += sampled_token_logprobs(model, micro).logp.sum(-1).tolist()
    return sorted(logps), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant", ["full model", "gradient checkpointing", "LoRA"])
def test_the_step_has_the_gradient_of_the_rows_run_whole(tiny_model: Path, variant: str) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model).float().train()
    if variant == "gradient checkpointing":  # no attention cache then: the rows run whole
        enable_gradient_checkpointing(model)
    if variant == "LoRA":
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    config = TrainingConfig(model_name=str(tiny_model), device="cpu", dtype="float32", batch_size=4)
    items = groups(count=2, size=4, vocab=model.config.vocab_size)
    whole_logp, whole = gradients(model, prepare_batch(items, 4, pad_multiple=1, pack=True), config)
    shared_batch = prepare_batch(items, 4, pad_multiple=1, pack=True, share_prefix=True)
    assert all(m.shared_prefix for m in shared_batch.micro_batches)
    shared_logp, shared = gradients(model, shared_batch, config)
    assert shared_logp == pytest.approx(whole_logp, abs=1e-4)
    assert shared.keys() == whole.keys()
    for name, grad in whole.items():
        assert torch.allclose(shared[name], grad, rtol=1e-3, atol=1e-6), name
    assert any(float(grad.abs().max()) > 0 for grad in whole.values())


def test_the_default_follows_gradient_checkpointing() -> None:
    assert TrainingConfig(model_name="m", device="cpu").shares_prompt_prefix
    assert not TrainingConfig(model_name="m", device="cpu", gradient_checkpointing=True).shares_prompt_prefix
    assert TrainingConfig(model_name="m", device="cuda", share_prompt_prefix=True).shares_prompt_prefix
