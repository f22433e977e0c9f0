"""Mixed precision and non-finite steps: bfloat16 compute keeps every update (float32 master
weights, optimizer state and checkpoints; the weights cast once a step), a sampled token outside the trainer's truncated
set trains to finite weights, and a non-finite step changes nothing."""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from example_trainer.checkpointing import save_checkpoint, save_lora_checkpoint
from example_trainer.config import TrainingConfig
from example_trainer.data import prepare_batch
from example_trainer.model import load_model_and_tokenizer, reference_logprobs
from example_trainer.optim import create_optimizer
from example_trainer.precision import Precision, precision_for
from example_trainer.trainers import MAX_SKIPPED_STEPS, TrainerError, announce, check_finite
from example_trainer.training import run_training_step
from tests.example_trainer.test_training import varied_groups
from tests.example_trainer.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), tokenizer_dir)


def config(model: Path, **overrides: Any) -> TrainingConfig:
    values: dict[str, Any] = dict(model_name=str(model), device="cpu", optimizer="adamw", lr=1e-5, batch_size=4,
                                  gradient_accumulation_steps=2, dtype="float32")
    values.update(overrides)
    return TrainingConfig(**values)


def flat_update(weights: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(weights[name].float() - start[name].float()).flatten() for name in sorted(start)])


def train_and_save(cfg: TrainingConfig, save_path: Path, steps: int = 2) -> dict[str, torch.Tensor]:
    """`steps` AdamW steps on the varied groups; the weights of the checkpoint written after them."""
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(cfg)
    optimizer = create_optimizer(model, cfg)
    batch = prepare_batch(varied_groups(tokenizer), cfg.batch_size, pack=True, pad_multiple=1)
    for step in range(steps):
        run_training_step(model, optimizer, batch, cfg, step)
    path = save_checkpoint(model, tokenizer, str(save_path), steps, optimizer=optimizer)
    return load_file(str(Path(path) / "model.safetensors"))


def test_precision_follows_the_dtype() -> None:
    single = precision_for(TrainingConfig(model_name="m", device="cpu", dtype="bfloat16"))
    assert (single.compute, single.master, single.mixed) == (torch.bfloat16, torch.float32, True)
    assert single.describe() == "compute bfloat16, master weights and optimizer state float32"
    with single.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    full = precision_for(TrainingConfig(model_name="m", device="cpu", dtype="float32"))
    assert not full.mixed and full.describe() == "compute and master weights float32"
    with full.autocast():
        assert not torch.is_autocast_enabled("cpu")
    sharded = precision_for(TrainingConfig(model_name="m", device="cpu", dtype="bfloat16", data_parallel="fsdp"), 2)
    with sharded.autocast():  # FSDP2's policy gathers the weights in bfloat16 itself
        assert not torch.is_autocast_enabled("cpu")
    assert sharded.fsdp_policy().param_dtype == torch.bfloat16 and sharded.fsdp_policy().reduce_dtype == torch.float32
    assert Precision(torch.float16).grad_scaler() is not None and single.grad_scaler() is None


def test_bfloat16_compute_keeps_the_update_float32_makes(tiny_model_dir: Path, tmp_path: Path) -> None:
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    reference = flat_update(train_and_save(config(tiny_model_dir), tmp_path / "fp32"), start)
    mixed = train_and_save(config(tiny_model_dir, dtype="bfloat16"), tmp_path / "bf16")
    update = flat_update(mixed, start)
    assert float((update != 0).float().mean()) > 0.9  # stepped in bfloat16, ~98% of these would round away
    assert float(update.norm() / reference.norm()) >= 0.5
    assert float(torch.nn.functional.cosine_similarity(update, reference, dim=0)) >= 0.5
    assert all(tensor.dtype == torch.float32 for tensor in mixed.values())  # the master weights, not a cast


def test_a_checkpoint_resumes_with_its_float32_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    saved = train_and_save(config(tiny_model_dir, dtype="bfloat16"), tmp_path / "ckpt", steps=1)
    resumed, _ = load_model_and_tokenizer(config(tiny_model_dir, dtype="bfloat16",
                                                 resume_from=str(tmp_path / "ckpt" / "step_1")))
    state = resumed.state_dict()
    for name, tensor in saved.items():
        assert state[name].dtype == torch.float32
        assert torch.equal(state[name], tensor), name


def test_lora_trains_float32_adapters_over_a_bfloat16_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = config(tiny_model_dir, dtype="bfloat16", weight_bridge_mode="lora_restart", lr=1e-4)
    model, tokenizer = load_model_and_tokenizer(cfg)
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained.values())
    assert all(p.dtype == torch.bfloat16 for p in frozen)
    before = {name: p.detach().clone() for name, p in trained.items()}
    optimizer = create_optimizer(model, cfg)
    batch = prepare_batch(varied_groups(tokenizer), cfg.batch_size, pack=True, pad_multiple=1)
    for step in range(2):
        run_training_step(model, optimizer, batch, cfg, step)
    moved = [name for name, p in trained.items() if "lora_A" in name and not torch.equal(p, before[name])]
    assert moved  # lora_B starts at 0, so after two steps both have moved
    path = save_lora_checkpoint(model, str(tmp_path), 2, optimizer=optimizer)
    adapter = load_file(str(Path(path) / "adapter_model.safetensors"))
    assert adapter and all(tensor.dtype == torch.float32 for tensor in adapter.values())


def test_the_start_up_line_names_the_compute_and_master_dtypes(capsys: pytest.CaptureFixture[str]) -> None:
    announce(TrainingConfig(model_name="m", device="cpu", dtype="bfloat16"))
    assert "dtype: compute bfloat16, master weights and optimizer state float32 (asked for with --dtype)" in \
        capsys.readouterr().out


def nucleus_edge_groups(tokenizer: Any) -> list[dict]:
    """`varied_groups` sampled at top-p 0.05: the trainer's nucleus is a single token at almost
    every position, so nearly every sampled token lies outside it."""
    return [dict(group, generation_params={"temperature": 0.8, "top_p": 0.05}) for group in varied_groups(tokenizer)]


@pytest.mark.parametrize("options", [{"tis_cap": 2.0}, {"kl_coef": 0.1}, {"kl_coef": 0.1, "kl_reference": "model"},
                                     {"tis_cap": 2.0, "kl_coef": 0.1, "dtype": "bfloat16"}],
                         ids=["tis", "kl-sampler", "kl-model", "tis-kl-bfloat16"])
def test_tokens_outside_the_trainers_top_p_set_train_to_finite_weights(tiny_model_dir: Path,
                                                                       options: dict[str, Any]) -> None:
    cfg = config(tiny_model_dir, lr=1e-2, **options)
    model, tokenizer = load_model_and_tokenizer(cfg)
    reference = reference_logprobs(model, cfg)
    optimizer = create_optimizer(model, cfg)
    batch = prepare_batch(nucleus_edge_groups(tokenizer), cfg.batch_size, pack=True, pad_multiple=1)
    before = [p.detach().clone() for p in model.parameters()]
    outside = []
    for step in range(2):
        metrics = run_training_step(model, optimizer, batch, cfg, step, reference)
        assert metrics["train/skipped_step"] == 0 and math.isfinite(metrics["loss"])
        assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
        outside.append(metrics["grpo/outside_truncation"])
    assert outside[0] > 0  # (at lr 1e-2 the repeated sampled tokens may become the most likely ones)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_non_finite_step_is_skipped_and_changes_nothing(tiny_model_dir: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(tiny_model_dir, lr=1e-2)
    model, tokenizer = load_model_and_tokenizer(cfg)
    optimizer = create_optimizer(model, cfg)
    groups = varied_groups(tokenizer)
    groups[0]["inference_logprobs"][0][-1] = float("nan")  # a broken sampler value: the loss is NaN
    batch = prepare_batch(groups, cfg.batch_size, pack=True, pad_multiple=1)
    before = [p.detach().clone() for p in model.parameters()]
    with caplog.at_level(logging.WARNING, logger="example_trainer"):
        metrics = run_training_step(model, optimizer, batch, cfg, 0)
    assert metrics["train/skipped_step"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters()) and not optimizer.state
    assert any("not finite: optimizer step skipped" in record.getMessage() for record in caplog.records)


def test_the_run_stops_after_consecutive_skipped_steps() -> None:
    run: Any = SimpleNamespace(skipped_in_a_row=0)
    skipped = {"train/skipped_step": 1, "loss": float("nan"), "grad_norm": float("nan")}
    check_finite(run, skipped, 1)
    check_finite(run, {"train/skipped_step": 0}, 2)  # a good step resets the count
    for done in range(3, 3 + MAX_SKIPPED_STEPS - 1):
        check_finite(run, skipped, done)
    with pytest.raises(TrainerError, match=r"steps 3-5 all had a non-finite loss or gradient norm"):
        check_finite(run, skipped, 3 + MAX_SKIPPED_STEPS - 1)


def test_float16_compute_scales_the_loss_and_trains(tiny_model_dir: Path) -> None:
    cfg = config(tiny_model_dir, dtype="float16", lr=1e-3)
    model, tokenizer = load_model_and_tokenizer(cfg)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    optimizer = create_optimizer(model, cfg)
    scaler = precision_for(cfg).grad_scaler()
    batch = prepare_batch(varied_groups(tokenizer), cfg.batch_size, pack=True, pad_multiple=1)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = run_training_step(model, optimizer, batch, cfg, 0, scaler=scaler)
    assert metrics["train/skipped_step"] == 0 and math.isfinite(metrics["grad_norm"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


class WeightCasts(TorchDispatchMode):
    """Counts the casts of `weights` (by identity) to bfloat16 during a training step."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.weights, self.count = {id(weight) for weight in weights}, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16 and \
                id(args[0]) in self.weights:
            self.count += 1
        return func(*args, **kwargs)


def test_a_step_casts_its_weights_once_for_all_its_micro_batches(tiny_model_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Autocast's bfloat16 copies of the weights are shared by the step's micro-batches, and the
    gradients are those of casting in every micro-batch."""
    cfg = config(tiny_model_dir, dtype="bfloat16")

    def one_step() -> tuple[int, list[torch.Tensor]]:
        torch.manual_seed(0)
        model, tokenizer = load_model_and_tokenizer(cfg)
        optimizer = create_optimizer(model, cfg)
        grads: list[torch.Tensor] = []
        monkeypatch.setattr(optimizer, "step", lambda: grads.extend(p.grad.clone() for p in model.parameters()))
        batch = prepare_batch(varied_groups(tokenizer), cfg.batch_size, pack=True, pad_multiple=1)
        assert len(batch.micro_batches) >= 2
        matrices = [p for p in model.parameters() if p.dim() == 2]
        with WeightCasts(matrices) as casts:
            run_training_step(model, optimizer, batch, cfg, 0)
        return casts.count, grads

    kept_casts, kept_grads = one_step()
    monkeypatch.setattr(Precision, "casts_kept", lambda self: contextlib.nullcontext())
    per_micro_casts, per_micro_grads = one_step()
    assert all(torch.equal(kept, per_micro) for kept, per_micro in zip(kept_grads, per_micro_grads))
    assert kept_casts * 2 <= per_micro_casts  # per micro-batch: once in each of the (at least) two forwards
