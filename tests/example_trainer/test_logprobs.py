"""The trainer's log-probabilities under the distribution a rollout was sampled from:
temperature, min-p, top-k and top-p as vLLM applies them, at the trained positions only."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from example_trainer.data import MicroBatch
from example_trainer.logprobs import entropy, sampled_token_logprobs, truncate


def kept_by_rule(logits: np.ndarray, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0) -> np.ndarray:
    """The tokens vLLM's sampler can draw, written from its documentation rather than its code:
    min-p keeps p >= min_p * max p; top-k keeps logits >= the k-th largest; top-p keeps the most
    likely tokens, in order, until their renormalised mass reaches p (the one that crosses it included)."""
    kept = np.ones_like(logits, dtype=bool)
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    if min_p > 0:
        kept &= probs >= min_p * probs.max()
    if top_k > 0:
        kept &= logits >= np.sort(logits[kept])[::-1][min(top_k, kept.sum()) - 1]
    if top_p < 1:
        masked = np.where(kept, probs, 0.0)
        masked /= masked.sum()
        order = np.argsort(-masked, kind="stable")
        mass, nucleus = 0.0, np.zeros_like(kept)
        for token in order:
            nucleus[token] = True
            mass += masked[token]
            if mass >= top_p:
                break
        kept &= nucleus
    return kept


@pytest.mark.parametrize("top_p,top_k,min_p", [(0.9, -1, 0.0), (1.0, 5, 0.0), (0.8, 7, 0.0), (1.0, -1, 0.1),
                                               (0.95, 20, 0.05), (0.3, -1, 0.0)])
def test_truncation_keeps_the_tokens_vllm_can_sample(top_p: float, top_k: int, min_p: float) -> None:
    torch.manual_seed(1)
    logits = torch.randn(16, 50) * 2
    out = truncate(logits, torch.full((16,), top_p), torch.full((16,), top_k, dtype=torch.long),
                   torch.full((16,), min_p))
    for row in range(16):
        expected = kept_by_rule(logits[row].numpy(), top_p, top_k, min_p)
        assert (torch.isfinite(out[row]).numpy() == expected).all()
        assert torch.equal(out[row][torch.isfinite(out[row])], logits[row][torch.isfinite(out[row])])


def test_rows_without_truncation_are_untouched_beside_truncated_ones() -> None:
    logits = torch.randn(2, 30)
    out = truncate(logits, torch.tensor([1.0, 0.5]), torch.tensor([-1, -1]), torch.tensor([0.0, 0.0]))
    assert torch.equal(out[0], logits[0])
    assert bool(torch.isinf(out[1]).any())


class Logits(torch.nn.Module):
    """A 'model' returning fixed logits."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, tokens: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits)


def micro(labels: list[list[int]], temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1) -> MicroBatch:
    rows = len(labels)
    truncated = top_p < 1 or top_k > 0
    return MicroBatch(tokens=torch.zeros(rows, len(labels[0]), dtype=torch.long), labels=torch.tensor(labels),
                      advantages=torch.zeros(rows, 1), temperatures=torch.full((rows, 1, 1), temperature),
                      inference_logprobs=None, logprobs_missing=torch.ones(rows, dtype=torch.bool),
                      sft=torch.zeros(rows, dtype=torch.bool),
                      top_p=torch.full((rows,), top_p) if truncated else None,
                      top_k=torch.full((rows,), top_k, dtype=torch.long) if truncated else None,
                      min_p=torch.zeros(rows) if truncated else None)


def test_logprobs_are_those_of_the_temperature_scaled_truncated_distribution() -> None:
    # one position over 3 tokens with probabilities (at T=0.5) proportional to e^4, e^2, e^0
    model = Logits(torch.tensor([[[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]))
    full, spread, _ = sampled_token_logprobs(model, micro([[1, -100]], temperature=0.5), with_entropy=True)
    norm = math.log(math.exp(4) + math.exp(2) + 1)
    assert full[0].tolist() == pytest.approx([2 - norm, 0.0])
    probs = np.exp(np.array([4.0, 2.0, 0.0]) - norm)
    assert spread[0, 0].item() == pytest.approx(float(-(probs * np.log(probs)).sum()), abs=1e-6)
    # top_k 2 drops token 2 and renormalises over the first two
    cut = sampled_token_logprobs(model, micro([[1, -100]], temperature=0.5, top_k=2)).logp
    assert cut[0, 0].item() == pytest.approx(2 - math.log(math.exp(4) + math.exp(2)), abs=1e-6)
    ignored = sampled_token_logprobs(model, micro([[1, -100]], temperature=0.5, top_k=2), match_truncation=False).logp
    assert ignored[0, 0].item() == pytest.approx(2 - norm, abs=1e-6)


def test_only_trained_positions_are_scored_and_gradients_reach_their_logits() -> None:
    torch.manual_seed(0)
    model = Logits(torch.randn(2, 4, 10))
    batch = micro([[-100, 3, 4, -100], [5, -100, -100, -100]], temperature=0.7, top_p=0.8)
    logp = sampled_token_logprobs(model, batch).logp
    assert logp[0, 0].item() == 0.0 and logp[1, 1].item() == 0.0
    logp.sum().backward()
    grad = model.logits.grad
    assert grad is not None
    assert float(grad[0, 0].abs().sum()) == 0.0 and float(grad[0, 1].abs().sum()) > 0


def test_a_sampled_token_outside_the_truncated_set_is_scored_untruncated_with_finite_gradients() -> None:
    # token 2 (logit 0) is outside top-k 2 at the trainer: the sampler drew it, so it must stay finite
    model = Logits(torch.tensor([[[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]], [[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]))
    batch = micro([[2, -100], [1, -100]], temperature=0.5, top_k=2)
    logp, _, outside = sampled_token_logprobs(model, batch)
    norm = math.log(math.exp(4) + math.exp(2) + 1)
    assert logp[0, 0].item() == pytest.approx(0 - norm, abs=1e-6)  # the untruncated distribution at T=0.5
    assert logp[1, 0].item() == pytest.approx(2 - math.log(math.exp(4) + math.exp(2)), abs=1e-6)  # truncated
    assert outside.tolist() == [[True, False], [False, False]]
    logp.sum().backward()
    assert model.logits.grad is not None and bool(torch.isfinite(model.logits.grad).all())
    assert float(model.logits.grad[0, 0].abs().sum()) > 0


def test_entropy_counts_truncated_tokens_as_impossible() -> None:
    assert entropy(torch.tensor([[0.0, 0.0, float("-inf")]]))[0].item() == pytest.approx(math.log(2))


def test_the_lm_head_runs_only_at_trained_positions_and_gives_the_same_logprobs(tokenizer_dir: Path,
                                                                               tmp_path: Path) -> None:
    from example_trainer.logprobs import model_logits_at
    from tests.example_trainer.tiny_model import build_tiny_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, tokenizer_dir)).float()
    tokens = torch.randint(0, model.config.vocab_size, (3, 9))
    positions = torch.zeros(3, 9, dtype=torch.bool)
    positions[0, 4:] = positions[1, 2:5] = positions[2, 8] = True
    head_inputs: list[int] = []
    model.lm_head.register_forward_hook(lambda module, inputs, output: head_inputs.append(inputs[0].shape[-2]))
    kept = model_logits_at(model, tokens, positions)
    assert head_inputs == [int(positions.sum())]  # the vocabulary projection only where trained
    assert torch.allclose(kept, model(tokens).logits[positions], atol=1e-5)
