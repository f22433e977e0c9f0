"""Every loss option pinned by a hand-computed case (`example_trainer.loss.policy_loss`).

The tensors are chosen so that each expected value can be worked out on paper: log-ratios
of ln 1.5 and ln 0.5, advantages of +-1, masks that make the aggregations differ.
"""

from __future__ import annotations

import math

import pytest
import torch

from example_trainer.loss import LossSettings, StepTotals, k3, policy_loss

LN15, LN05 = math.log(1.5), math.log(0.5)


def approx(expected: object) -> object:
    """Equal within float32 rounding."""
    return pytest.approx(expected, abs=1e-6)


def run(settings: LossSettings, totals: StepTotals, logp: list[list[float]], sampler: list[list[float]],
        advantages: list[float], mask: list[list[int]], **kwargs: torch.Tensor) -> tuple[float, list[float]]:
    """The loss and d loss / d logp (flattened row by row) for one micro-batch."""
    logp_tensor = torch.tensor(logp, requires_grad=True)
    terms = policy_loss(logp_tensor, torch.tensor(sampler), torch.tensor(advantages).view(-1, 1),
                        torch.tensor(mask, dtype=torch.bool), settings, totals, **kwargs)
    terms.loss.backward()
    assert logp_tensor.grad is not None
    return terms.loss.item(), logp_tensor.grad.flatten().tolist()


# Two sequences: row 0 has 1 trained token with ratio 1.5 and A=+1; row 1 has 2 trained
# tokens with ratios 0.5 and 1.5 and A=-1. Row 0's second position is masked.
LOGP = [[0.0, 0.0], [0.0, 0.0]]
SAMPLER = [[-LN15, 9.0], [-LN05, -LN15]]
ADVANTAGES = [1.0, -1.0]
MASK = [[1, 0], [1, 1]]
TOTALS = StepTotals(sequences=2, tokens=3, norm_length=4)


def test_grpo_is_the_token_mean_per_sequence_then_the_mean_over_sequences() -> None:
    loss, grad = run(LossSettings(), TOTALS, LOGP, SAMPLER, ADVANTAGES, MASK)
    # row 0: -min(1.5, 1.2) = -1.2; row 1: mean(-min(-0.5, -0.8), -min(-1.5, -1.2)) = mean(0.8, 1.5)
    assert loss == approx((-1.2 + (0.8 + 1.5) / 2) / 2)
    # only row 1's second token is unclipped: d(-r A)/d logp = -r A = 1.5, / 2 tokens / 2 sequences
    assert grad == approx([0.0, 0.0, 0.0, 1.5 / 4])


def test_dapo_is_the_token_mean_over_the_whole_step() -> None:
    loss, grad = run(LossSettings(loss_type="dapo"), TOTALS, LOGP, SAMPLER, ADVANTAGES, MASK)
    assert loss == approx((-1.2 + 0.8 + 1.5) / 3)
    assert grad == approx([0.0, 0.0, 0.0, 1.5 / 3])


def test_dr_grpo_divides_the_token_sum_by_sequences_times_a_constant_length() -> None:
    loss, grad = run(LossSettings(loss_type="dr_grpo"), TOTALS, LOGP, SAMPLER, ADVANTAGES, MASK)
    assert loss == approx((-1.2 + 0.8 + 1.5) / (2 * 4))
    assert grad == approx([0.0, 0.0, 0.0, 1.5 / 8])


def test_gspo_takes_one_ratio_per_sequence_the_geometric_mean_of_its_tokens() -> None:
    loss, grad = run(LossSettings(loss_type="gspo"), TOTALS, LOGP, SAMPLER, ADVANTAGES, MASK)
    # row 0: s = 1.5, clipped to 1.2 (A > 0): -1.2; row 1: s = sqrt(0.5 * 1.5) = 0.866, inside
    # [0.8, 1.2], A = -1: loss +0.866 and d s / d logp_t = s / 2 for each of its tokens
    s1 = math.sqrt(0.75)
    assert loss == approx((-1.2 + s1) / 2)
    assert grad == approx([0.0, 0.0, s1 / 2 / 2, s1 / 2 / 2])


def test_epsilon_high_raises_only_the_upper_clip() -> None:
    loss, grad = run(LossSettings(clip_eps=0.2, clip_eps_high=0.6), TOTALS, LOGP, SAMPLER, ADVANTAGES, MASK)
    # row 0's ratio 1.5 is now inside [0.8, 1.6]: -1.5 with gradient -1.5; row 1 unchanged
    assert loss == approx((-1.5 + (0.8 + 1.5) / 2) / 2)
    assert grad == approx([-1.5 / 2, 0.0, 0.0, 1.5 / 4])


def test_dual_clip_bounds_the_loss_of_negative_advantages() -> None:
    # a token now 4x likelier than sampled with A = -1: plain loss +4, dual clip 3 caps it at +3
    loss, grad = run(LossSettings(dual_clip=3.0), StepTotals(1, 1), [[0.0]], [[-math.log(4.0)]], [-1.0], [[1]])
    assert loss == approx(3.0)
    assert grad == [0.0]
    # below the cap nothing changes: ratio 1.5 -> loss 1.5, gradient 1.5
    loss, grad = run(LossSettings(dual_clip=3.0), StepTotals(1, 1), [[0.0]], [[-LN15]], [-1.0], [[1]])
    assert loss == approx(1.5) and grad == approx([1.5])
    # positive advantages are never dual-clipped
    loss, _ = run(LossSettings(dual_clip=3.0, clip_eps=10.0), StepTotals(1, 1), [[0.0]], [[-math.log(4.0)]],
                  [1.0], [[1]])
    assert loss == approx(-4.0)


def test_truncated_importance_sampling_weights_by_the_capped_trainer_sampler_ratio() -> None:
    # trainer/sampler ratios 1.5 (under the cap 2) and 4 (capped to 2); A = +1 each, one sequence
    loss, grad = run(LossSettings(tis_cap=2.0), StepTotals(1, 2), [[0.0, 0.0]], [[-LN15, -math.log(4.0)]],
                     [1.0], [[1, 1]])
    # the PPO ratio is against the trainer itself (1), so each token is -A * w
    assert loss == approx(-(1.5 + 2.0) / 2)
    assert grad == approx([-1.5 / 2, -2.0 / 2])


def test_kl_adds_k3_against_the_sampler_or_the_reference() -> None:
    plain, _ = run(LossSettings(), StepTotals(1, 1), [[0.0]], [[0.3]], [0.0], [[1]])
    with_kl, _ = run(LossSettings(kl_coef=0.5), StepTotals(1, 1), [[0.0]], [[0.3]], [0.0], [[1]])
    assert with_kl - plain == approx(0.5 * (math.exp(0.3) - 0.3 - 1))
    with_reference, grad = run(LossSettings(kl_coef=0.5), StepTotals(1, 1), [[0.0]], [[0.3]], [0.0], [[1]],
                               reference_logp=torch.tensor([[-0.2]]))
    assert with_reference == approx(0.5 * (math.exp(-0.2) + 0.2 - 1))
    # d k3(ref - logp) / d logp = 1 - exp(ref - logp)
    assert grad == approx([0.5 * (1 - math.exp(-0.2))])
    assert float(k3(torch.tensor(0.0))) == 0.0


def test_sft_rows_use_cross_entropy_and_masked_tokens_count_for_nothing() -> None:
    loss, grad = run(LossSettings(), StepTotals(2, 2), [[-0.5, -7.0], [0.0, 0.0]], [[0.0, 0.0], [-LN15, 0.0]],
                     [5.0, 1.0], [[1, 0], [1, 0]], sft=torch.tensor([True, False]))
    assert loss == approx((0.5 - 1.2) / 2)
    assert grad == approx([-0.5, 0.0, 0.0, 0.0])


def test_clip_binds_marks_exactly_the_tokens_whose_gradient_the_clip_removed() -> None:
    terms = policy_loss(torch.zeros(2, 2, requires_grad=True), torch.tensor(SAMPLER), torch.tensor(ADVANTAGES).view(-1, 1),
                        torch.tensor(MASK, dtype=torch.bool), LossSettings(), TOTALS)
    # row 0 token 0 (A>0, r>1.2) and row 1 token 0 (A<0, r<0.8) bind; row 1 token 1 does not
    assert terms.clip_binds.tolist() == [[True, False], [True, False]]
    assert terms.ratio[0, 0].item() == approx(1.5)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_micro_batches_add_up_to_the_whole_batch(loss_type: str) -> None:
    torch.manual_seed(0)
    logp = (-torch.rand(6, 5)).requires_grad_()
    sampler = -torch.rand(6, 5)
    advantages = torch.randn(6, 1)
    mask = torch.rand(6, 5) > 0.3
    settings = LossSettings(loss_type=loss_type, tis_cap=None, kl_coef=0.1)  # type: ignore[arg-type]
    totals = StepTotals(sequences=6, tokens=int(mask.sum()), norm_length=5)
    whole = policy_loss(logp, sampler, advantages, mask, settings, totals).loss
    halves = sum(policy_loss(logp[rows], sampler[rows], advantages[rows], mask[rows], settings, totals).loss
                 for rows in (slice(0, 2), slice(2, 6)))
    assert float(halves.detach()) == approx(float(whole.detach()))
