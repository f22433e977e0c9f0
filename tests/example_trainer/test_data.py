"""Batch preparation: Atropos's shapes and values, and the additions (missing logprobs, env
advantages, sft rows, sampling parameters, packing, reward scaling, the length limit and
policy versions)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from example_trainer.data import (
    Sampling,
    group_advantages,
    pad_data_to_good_offset,
    prepare_batch,
    rollout_sampling,
    rollout_temperature,
    working_length,
)


def item(tokens: list[list[int]], prompt: int = 1, scores: Any = None, **extra: Any) -> dict:
    """A group whose first `prompt` tokens of every rollout are masked."""
    body = {"tokens": tokens, "masks": [[-100] * prompt + row[prompt:] for row in tokens],
            "scores": scores if scores is not None else [1.0] * len(tokens),
            "overrides": None, "generation_params": None, "group_overrides": None}
    body.update(extra)
    return body


# The expected values below were produced by Atropos 0.4.0's pad_data_to_good_offset on this batch.
REFERENCE_BATCH = {"batch": [
    {"tokens": [[11, 12, 13, 14, 15], [21, 22, 23]], "masks": [[-100, -100, 13, 14, 15], [-100, 22, 23]],
     "scores": [1.0, 0.0], "inference_logprobs": [[1.0, 1.0, -0.5, -0.25, -2.0], [1.0, -1.5, -0.125]],
     "overrides": [{"temperature": 0.5}, {"set_advantage_to_zero": False}], "generation_params": {"temperature": 0.8},
     "group_overrides": None},
    {"tokens": [[31, 32, 33, 34], [41, 42, 43, 44], [51, 52, 53, 54]],
     "masks": [[-100, -100, 33, 34], [-100, 42, 43, 44], [-100, -100, -100, 54]],
     "scores": [1, 2, 4], "inference_logprobs": [[1.0, 1.0, -0.75, -1.0], [1.0, -0.5, -0.5, -0.5]],
     "overrides": [{}, {"set_advantage_to_zero": True}, {}], "generation_params": None,
     "group_overrides": {"temperature": 1.2}},
    {"tokens": [[61, 62]], "masks": [[-100, 62]], "scores": [0.7], "overrides": None,
     "generation_params": None, "group_overrides": None},
]}
REFERENCE_HEADS = {  # first 6 positions of each row; every later position is padding
    "tokens": [[[11, 12, 13, 14, 15, 0], [21, 22, 23, 0, 0, 0], [31, 32, 33, 34, 0, 0], [41, 42, 43, 44, 0, 0]],
               [[51, 52, 53, 54, 0, 0], [61, 62, 0, 0, 0, 0]]],
    "labels": [[[-100, 13, 14, 15, -100, -100], [22, 23, -100, -100, -100, -100], [-100, 33, 34, -100, -100, -100],
                [42, 43, 44, -100, -100, -100]],
               [[-100, -100, 54, -100, -100, -100], [62, -100, -100, -100, -100, -100]]],
    "logprobs": [[[1.0, -0.5, -0.25, -2.0, 1.0, 1.0], [-1.5, -0.125, 1.0, 1.0, 1.0, 1.0],
                  [1.0, -0.75, -1.0, 1.0, 1.0, 1.0], [-0.5, -0.5, -0.5, 1.0, 1.0, 1.0]],
                 [[1.0] * 6, [1.0] * 6]],
}
REFERENCE_ADVANTAGES = [[1.0, -1.0, -1.0690449676496978, 0.0], [1.3363062095621219, 0.7]]
REFERENCE_TEMPERATURES = [[0.5, 0.8, 1.2, 1.2], [1.2, 1.0]]


def test_matches_the_reference_on_a_mixed_batch() -> None:
    data = copy.deepcopy(REFERENCE_BATCH)
    tokens, labels, advantages, temperatures, logprobs = pad_data_to_good_offset(data, 4)
    assert data == REFERENCE_BATCH  # the input is not modified
    assert [t.shape for t in tokens] == [(4, 64), (2, 64)] and [t.shape for t in labels] == [(4, 64), (2, 64)]
    assert all(t.dtype == torch.long for t in tokens + labels)
    assert [t.shape for t in advantages] == [(4, 1), (2, 1)]
    assert [t.shape for t in temperatures] == [(4, 1, 1), (2, 1, 1)]
    assert logprobs is not None and [t.shape for t in logprobs] == [(4, 64), (2, 64)]
    assert all(t.dtype == torch.float32 for t in temperatures + logprobs)
    for name, got in (("tokens", tokens), ("labels", labels), ("logprobs", logprobs)):
        pad = {"tokens": 0, "labels": -100, "logprobs": 1.0}[name]
        for batch, heads in zip(got, REFERENCE_HEADS[name]):
            assert batch[:, :6].tolist() == heads
            assert (batch[:, 6:] == pad).all()
    for batch, expected in zip(advantages, REFERENCE_ADVANTAGES):
        assert batch.flatten().tolist() == pytest.approx(expected, abs=1e-6)
    for batch, expected in zip(temperatures, REFERENCE_TEMPERATURES):
        assert batch.flatten().tolist() == pytest.approx(expected)


@pytest.mark.parametrize("longest, labels_width", [(2, 64), (5, 64), (64, 64), (65, 64), (66, 128), (129, 128),
                                                   (130, 192)])
def test_padding_makes_the_label_width_a_multiple_of_64(longest: int, labels_width: int) -> None:
    assert working_length(longest) - 1 == labels_width
    prepared = prepare_batch([item([[7] * longest, [8] * 3], scores=[1.0, 0.0])], 2)
    assert prepared.micro_batches[0].tokens.shape == (2, labels_width)
    assert prepared.micro_batches[0].labels.shape == (2, labels_width)


def test_group_advantages_normalise_with_population_std_and_keep_single_scores() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0]).tolist() == [1.0, -1.0, -1.0, 1.0]
    assert group_advantages([0.5, 0.5]).tolist() == [0.0, 0.0]  # std floor: no division by zero
    assert group_advantages([0.7]).tolist() == [0.7]
    assert group_advantages([1.0, 0.0], [{"set_advantage_to_zero": True}, None]).tolist() == [0.0, -1.0]
    assert group_advantages([3.0], [{"set_advantage_to_zero": True}]).tolist() == [0.0]


def test_temperature_precedence() -> None:
    group = item([[1, 2]], overrides=[{"temperature": 0.3}], generation_params={"temperature": 0.6},
                 group_overrides={"temperature": 0.9})
    assert rollout_temperature(group, 0) == 0.3
    group["overrides"] = [{}]
    assert rollout_temperature(group, 0) == 0.6
    group["generation_params"] = None
    assert rollout_temperature(group, 0) == 0.9
    group["group_overrides"] = {}
    assert rollout_temperature(group, 0) == 1.0


def test_micro_batches_chunk_in_order_and_count_trained_tokens() -> None:
    groups = [item([[i, i + 1, i + 2]] * 2, scores=[1.0, 0.0]) for i in range(1, 10, 3)]
    prepared = prepare_batch(groups, 4)
    assert [m.size for m in prepared.micro_batches] == [4, 2]
    assert prepared.num_sequences == 6 and prepared.num_tokens == 6 * 2
    assert prepared.micro_batches[1].tokens[:, 0].tolist() == [7, 7]


def test_null_and_missing_logprob_rows_are_marked_not_fatal() -> None:
    groups = [item([[1, 2, 3]] * 2, scores=[1.0, 0.0], inference_logprobs=None),
              item([[4, 5, 6]] * 2, scores=[1.0, 0.0], inference_logprobs=[[1.0, -0.5, -0.5]]),
              item([[7, 8, 9]], scores=[1.0], inference_logprobs=[None])]
    prepared = prepare_batch(groups, 8)
    micro = prepared.micro_batches[0]
    assert prepared.had_inference_logprobs
    assert micro.logprobs_missing.tolist() == [True, True, False, True, True]
    assert micro.inference_logprobs is not None
    assert (micro.inference_logprobs[[0, 1, 3, 4]] == 1.0).all()
    assert micro.inference_logprobs[2, :2].tolist() == [-0.5, -0.5]


def test_without_any_logprobs_the_logprob_batches_are_none() -> None:
    groups = [item([[1, 2, 3]] * 2, scores=[1.0, 0.0])]
    assert pad_data_to_good_offset({"batch": groups}, 2)[4] is None
    with_rows = [item([[1, 2, 3]] * 2, scores=[1.0, 0.0], inference_logprobs=[[1.0, -1.0, -1.0]] * 2)]
    assert pad_data_to_good_offset({"batch": with_rows}, 2, extract_inference_logprobs=False)[4] is None
    prepared = prepare_batch(with_rows, 2, extract_inference_logprobs=False)
    assert prepared.micro_batches[0].logprobs_missing.all()


def test_env_advantages_are_per_token_and_shifted_like_labels() -> None:
    groups = [item([[1, 2, 3, 4]] * 2, scores=[1.0, 0.0], advantages=[[0.0, 0.1, 0.2, 0.3], None]),
              item([[5, 6]], scores=[2.0], advantages=[[9.0, 0.5]], overrides=[{"set_advantage_to_zero": True}])]
    micro = prepare_batch(groups, 4, use_env_advantages=True).micro_batches[0]
    assert micro.advantages.shape == micro.labels.shape == (3, 64)
    assert micro.advantages[0, :4].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.0])
    assert (micro.advantages[1] == -1.0).all()  # no per-token row: the group-normalised score everywhere
    assert (micro.advantages[2] == 0.0).all()  # set_advantage_to_zero wins over the environment's values
    ignored = prepare_batch(groups, 4).micro_batches[0]
    assert ignored.advantages.shape == (3, 1)


def test_sft_rows_from_rollout_or_group_overrides() -> None:
    groups = [item([[1, 2]] * 2, scores=[1.0, 0.0], overrides=[{"sft": True}, {}]),
              item([[3, 4]], scores=[1.0], group_overrides={"sft": True})]
    assert prepare_batch(groups, 4).micro_batches[0].sft.tolist() == [True, False, True]


@pytest.mark.parametrize("bad, message", [
    ({"masks": [[-100, 2]]}, "must match"),
    ({"masks": [[-100, 2, 3, 4]] * 2}, "mask entries"),
])
def test_inconsistent_groups_fail_with_a_clear_message(bad: dict, message: str) -> None:
    group = item([[1, 2, 3]] * 2, scores=[1.0, 0.0])
    group.update(bad)
    with pytest.raises(ValueError, match=message):
        prepare_batch([group], 2)


def test_empty_batch_is_an_error() -> None:
    with pytest.raises(ValueError, match="no rollouts"):
        prepare_batch([], 2)


def test_as_tuple_is_the_reference_five_tuple() -> None:
    prepared = prepare_batch([item([[1, 2, 3]] * 3, scores=[1.0, 0.0, 0.5])], 2)
    tokens, labels, advantages, temperatures, logprobs = prepared.as_tuple()
    assert len(tokens) == len(labels) == len(advantages) == len(temperatures) == 2 and logprobs is None
    assert np.isclose(float(advantages[0].sum() + advantages[1].sum()), 0.0, atol=1e-6)


def test_sampling_parameters_come_from_the_rollout_the_group_or_neutral_values() -> None:
    group = item([[1, 2], [3, 4]], overrides=[{"top_p": 0.5}, {}],
                 generation_params={"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05})
    assert rollout_sampling(group, 0) == Sampling(temperature=0.7, top_p=0.5, top_k=40, min_p=0.05)
    assert rollout_sampling(group, 1) == Sampling(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05)
    assert rollout_sampling(item([[1, 2]]), 0) == Sampling() and not Sampling().truncates
    assert rollout_sampling(item([[1, 2]], generation_params={"top_k": 0}), 0).top_k == -1  # vLLM's "off"
    with pytest.raises(ValueError, match="unreadable sampling parameters"):
        rollout_sampling(item([[1, 2]], generation_params={"temperature": "hot"}), 0)


def test_micro_batches_carry_truncation_only_when_a_rollout_was_truncated() -> None:
    plain = prepare_batch([item([[1, 2, 3]] * 2, generation_params={"temperature": 0.5})], 2).micro_batches[0]
    assert plain.top_p is None and not plain.truncated
    assert plain.temperatures.view(-1).tolist() == [0.5, 0.5]
    cut = prepare_batch([item([[1, 2, 3]] * 2, overrides=[{"top_p": 0.8}, {}])], 2).micro_batches[0]
    assert cut.truncated and cut.top_p is not None and cut.top_p.tolist() == pytest.approx([0.8, 1.0])


@pytest.mark.parametrize("longest,multiple,width", [(5, 64, 65), (5, 1, 5), (5, 8, 9), (9, 8, 9), (1, 64, 1)])
def test_working_length_rounds_the_label_width_up_to_the_multiple(longest: int, multiple: int, width: int) -> None:
    assert working_length(longest, multiple) == width


def test_packing_sorts_by_length_and_pads_each_micro_batch_to_its_own_longest() -> None:
    rows = [[1] * n for n in (3, 9, 4, 8)]
    prepared = prepare_batch([item(rows, scores=[0.0, 1.0, 0.0, 1.0])], 2, pack=True, pad_multiple=1)
    assert [tuple(m.tokens.shape) for m in prepared.micro_batches] == [(2, 8), (2, 3)]
    assert prepared.positions == 2 * 8 + 2 * 3
    unpacked = prepare_batch([item(rows, scores=[0.0, 1.0, 0.0, 1.0])], 2)
    assert [tuple(m.tokens.shape) for m in unpacked.micro_batches] == [(2, 64), (2, 64)]
    assert prepared.num_tokens == unpacked.num_tokens


def test_scale_rewards_group_batch_or_none() -> None:
    groups = [item([[1, 2]] * 2, scores=[0.0, 2.0]), item([[1, 2]] * 2, scores=[0.0, 0.5])]
    advantages = lambda mode: torch.cat([m.advantages.view(-1) for m in  # noqa: E731
                                         prepare_batch(groups, 4, scale_rewards=mode).micro_batches]).tolist()
    assert advantages("group") == pytest.approx([-1.0, 1.0, -1.0, 1.0])
    batch_std = float(np.std([0.0, 2.0, 0.0, 0.5]))
    assert advantages("batch") == pytest.approx([-1 / batch_std, 1 / batch_std, -0.25 / batch_std, 0.25 / batch_std])
    assert advantages("none") == pytest.approx([-1.0, 1.0, -0.25, 0.25])


def test_rollouts_longer_than_the_limit_are_left_out_and_counted() -> None:
    prepared = prepare_batch([item([[1] * 5, [1] * 12, [1] * 6], scores=[0.0, 1.0, 2.0])], 8, max_length=10)
    assert prepared.num_sequences == 2 and prepared.too_long == 1
    assert prepared.micro_batches[0].advantages.view(-1).tolist() == pytest.approx(
        group_advantages([0.0, 1.0, 2.0])[[0, 2]].tolist())  # scored with the whole group
    with pytest.raises(ValueError, match="longer than 4 tokens"):
        prepare_batch([item([[1] * 5])], 8, max_length=4)


def test_each_group_reports_its_policy_version() -> None:
    groups = [item([[1, 2]] * 2, generation_params={"policy_version": 3}),
              item([[1, 2]] * 2, generation_params={"policy_version": 5}, overrides=[{"policy_version": 4}, {}]),
              item([[1, 2]] * 2)]
    assert prepare_batch(groups, 8).policy_versions == [3, 4, None]
