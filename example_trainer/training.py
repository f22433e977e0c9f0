"""One GRPO optimizer step: the clipped-surrogate loss, the optimizer, and the step's metrics.

The policy loss is PPO's clipped surrogate against the sampler. For every trained token
(``labels != -100``) with current log-probability ``logp``, sampler log-probability ``q``
and advantage ``A``, the ratio is ``r = exp(logp - q)`` and the token's objective

    min(r * A, clip(r, 1 - eps, 1 + eps) * A)

for both signs of ``A`` (so the update stops once the ratio has moved ``eps`` in the
direction the advantage asks for, and is never stopped in the other direction). The loss
is the objective's negative, averaged over each sequence's trained tokens, then over
sequences, then divided by the gradient-accumulation steps. Options: a ``kl_coef`` times
the k3 estimate ``exp(q - logp) - (q - logp) - 1``; rollouts flagged ``sft`` are trained
with plain cross-entropy; rollouts without sampler log-probabilities are either trained
on-policy (``q`` = detached ``logp``, ratio 1) or refused, per ``missing_logprobs``.

Metrics keep Atropos's names (``train/loss``, ``grpo/mean_ratio``, ``alignment/diff_mean``
and so on) so existing W&B dashboards read them.
"""

from __future__ import annotations

import logging
import random
import string
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from atroposlib.envs.wandb_logging import WandbRun
from example_trainer.config import TrainingConfig
from example_trainer.data import LABEL_PAD, MicroBatch, PreparedBatch

log = logging.getLogger("example_trainer")

MAX_GRAD_NORM = 1.0
MISALIGNED_SAMPLER_LOGP = 0.5  # a mean sampler logprob above this means 1.0 placeholders were trained on
STEP_KEYS = ("loss", "lr", "grad_norm", "pos_logp", "neg_logp", "pos_count", "neg_count", "mean_ratio",
             "clipped_fraction")
TIMING_KEYS = ("step_time", "sync_time", "data_fetch_time", "gpu_memory_gb", "gpu_memory_reserved_gb")

_wandb = WandbRun()
_warned_missing_logprobs = False


# --- optimizer -------------------------------------------------------------------------

def create_optimizer(model: torch.nn.Module, config: TrainingConfig) -> torch.optim.Optimizer:
    """The configured optimizer over the trainable parameters, falling back to AdamW."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise RuntimeError("the model has no trainable parameters (check --train-layer-indices or the LoRA settings)")
    if config.optimizer == "adamw_8bit":
        try:
            import bitsandbytes
        except ImportError:
            log.warning("optimizer adamw_8bit needs bitsandbytes, which is not installed: using AdamW "
                        "(pip install bitsandbytes, or --optimizer adamw to silence this)")
        else:
            return bitsandbytes.optim.AdamW8bit(params, lr=config.lr)
    if config.optimizer == "adafactor":
        try:
            from transformers.optimization import Adafactor
        except ImportError:
            log.warning("optimizer adafactor needs transformers' Adafactor, which is unavailable: using AdamW")
        else:
            # Adafactor computes its own step size with relative_step and refuses a manual one.
            lr = None if config.adafactor_relative_step else config.lr
            return Adafactor(params, lr=lr, scale_parameter=config.adafactor_scale_parameter,
                             relative_step=config.adafactor_relative_step, warmup_init=False)
    return torch.optim.AdamW(params, lr=config.lr)


def learning_rate(config: TrainingConfig, step_idx: int) -> float:
    """The learning rate of step `step_idx` (0-based): linear warm-up, then constant."""
    if config.warmup_steps > 0 and step_idx < config.warmup_steps:
        return config.lr * (step_idx + 1) / config.warmup_steps
    return config.lr


# --- loss ------------------------------------------------------------------------------

def token_logprobs(model: torch.nn.Module, micro: MicroBatch) -> torch.Tensor:
    """``[B, P]`` log-probabilities of the labels at the sampling temperature (0 where masked)."""
    logits = model(micro.tokens).logits.float()
    temperatures = micro.temperatures.to(logits.device, logits.dtype)
    temperatures = torch.where(temperatures <= 0, torch.ones_like(temperatures), temperatures)
    scaled = logits / temperatures
    return -F.cross_entropy(scaled.reshape(-1, scaled.size(-1)), micro.labels.reshape(-1), reduction="none",
                            ignore_index=LABEL_PAD).view(micro.labels.shape)


def _sampler_logprobs(logp: torch.Tensor, micro: MicroBatch,
                      missing_logprobs: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's log-probabilities, with detached current ones standing in for missing rows."""
    global _warned_missing_logprobs
    missing = micro.logprobs_missing.to(logp.device)
    if micro.inference_logprobs is None:
        missing = torch.ones_like(missing)
    if not bool(missing.any()):
        return micro.inference_logprobs.to(logp.device, logp.dtype), missing
    if missing_logprobs == "error":
        raise ValueError(f"{int(missing.sum())} of {missing.numel()} rollouts have no inference_logprobs; GRPO "
                         "needs the sampler's log-probabilities (run the environment with server_type vllm, "
                         "or --missing-logprobs on_policy to train those rollouts on-policy)")
    if not _warned_missing_logprobs:
        log.warning("some rollouts have no inference_logprobs: they are trained on-policy (ratio 1, no clipping); "
                    "environments with server_type vllm send them")
        _warned_missing_logprobs = True
    if micro.inference_logprobs is None:
        return logp.detach(), missing
    sampled = micro.inference_logprobs.to(logp.device, logp.dtype)
    return torch.where(missing.unsqueeze(-1), logp.detach(), sampled), missing


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    total = mask.sum()
    return float((values * mask).sum() / total) if total > 0 else 0.0


def compute_grpo_loss(model: torch.nn.Module, micro: MicroBatch, *, gradient_accumulation_steps: int,
                      clip_eps: float, kl_coef: float = 0.0,
                      missing_logprobs: str = "on_policy") -> tuple[torch.Tensor, dict[str, Any]]:
    """The scaled loss of one micro-batch (ready for ``backward``) and its diagnostics."""
    logp = token_logprobs(model, micro)
    mask = (micro.labels != LABEL_PAD).to(logp.dtype)
    sampled, missing = _sampler_logprobs(logp, micro, missing_logprobs)
    advantages = micro.advantages.to(logp.device, logp.dtype).expand_as(logp)
    ratio = torch.exp(logp - sampled)
    objective = torch.min(ratio * advantages, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages)
    per_token = -objective
    if kl_coef > 0:
        log_ratio = sampled - logp
        per_token = per_token + kl_coef * (torch.exp(log_ratio) - log_ratio - 1)
    sft = micro.sft.to(logp.device).unsqueeze(-1)
    per_token = torch.where(sft, -logp, per_token)
    per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp_min(1e-8)
    loss = per_sequence.mean() / gradient_accumulation_steps
    with torch.no_grad():
        metrics = _diagnostics(logp, sampled, ratio, advantages, mask, missing, sft, clip_eps)
    return loss, metrics


def _diagnostics(logp: torch.Tensor, sampled: torch.Tensor, ratio: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, missing: torch.Tensor, sft: torch.Tensor, clip_eps: float) -> dict[str, Any]:
    """Ratio, clipping, sampler alignment and per-sign log-probabilities of one micro-batch."""
    policy = mask * (~sft).to(mask.dtype)
    clipped = ((ratio < 1 - clip_eps) | (ratio > 1 + clip_eps)).to(mask.dtype)
    aligned = (policy * (~missing).unsqueeze(-1).to(mask.dtype)).bool()
    train_flat, inference_flat = logp[aligned], sampled[aligned]
    diff = train_flat - inference_flat
    if inference_flat.numel() and float(inference_flat.mean()) > MISALIGNED_SAMPLER_LOGP:
        log.warning("mean sampler logprob on trained tokens is %.3f (> %.1f): inference_logprobs look misaligned "
                    "with the masks", float(inference_flat.mean()), MISALIGNED_SAMPLER_LOGP)
    sequence_logp = (logp * mask).sum(-1) / mask.sum(-1).clamp_min(1e-8)
    sequence_advantage = (advantages * mask).sum(-1) / mask.sum(-1).clamp_min(1e-8)
    positive = sequence_advantage > 0
    has_policy = bool(policy.sum() > 0)
    return {
        "mean_ratio": _masked_mean(ratio, policy) if has_policy else 1.0,
        "clipped_fraction": _masked_mean(clipped, policy),
        "logprob_diff_mean": float(diff.mean()) if diff.numel() else 0.0,
        "logprob_diff_abs_mean": float(diff.abs().mean()) if diff.numel() else 0.0,
        "logprob_diff_max": float(diff.abs().max()) if diff.numel() else 0.0,
        "pos_logp": float(sequence_logp[positive].mean()) if bool(positive.any()) else 0.0,
        "neg_logp": float(sequence_logp[~positive].mean()) if bool((~positive).any()) else 0.0,
        "pos_count": int(positive.sum()),
        "neg_count": int((~positive).sum()),
        "missing_count": int(missing.sum()),
        "sft_count": int(sft.sum()),
        "training_logprobs": train_flat.detach().cpu(),
        "inference_logprobs": inference_flat.detach().cpu(),
    }


# --- step ------------------------------------------------------------------------------

@dataclass
class _StepTotals:
    """Running sums over the micro-batches of one step."""

    loss: float = 0.0
    pos_logp_sum: float = 0.0
    neg_logp_sum: float = 0.0
    pos_count: int = 0
    neg_count: int = 0
    mean_ratio: float = 0.0
    clipped_fraction: float = 0.0
    diff_mean: float = 0.0
    diff_abs_mean: float = 0.0
    diff_max: float = 0.0

    def add(self, loss: float, m: dict[str, Any]) -> None:
        self.loss += loss
        self.pos_logp_sum += m["pos_logp"] * m["pos_count"]
        self.neg_logp_sum += m["neg_logp"] * m["neg_count"]
        self.pos_count += m["pos_count"]
        self.neg_count += m["neg_count"]
        self.mean_ratio += m["mean_ratio"]
        self.clipped_fraction += m["clipped_fraction"]
        self.diff_mean += m["logprob_diff_mean"]
        self.diff_abs_mean += m["logprob_diff_abs_mean"]
        self.diff_max = max(self.diff_max, m["logprob_diff_max"])


def _spread(prefix: str, values: list[torch.Tensor]) -> dict[str, float]:
    flat = torch.cat(values) if values else torch.empty(0)
    if not flat.numel():
        return {}
    std = float(flat.std()) if flat.numel() > 1 else 0.0
    return {f"{prefix}_mean": float(flat.mean()), f"{prefix}_std": std}


def run_training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: PreparedBatch,
                      config: TrainingConfig, step_idx: int) -> dict[str, Any]:
    """Forward and backward every micro-batch, clip the gradient norm to 1, step; the step's metrics."""
    lr = learning_rate(config, step_idx)
    for group in optimizer.param_groups:
        group["lr"] = lr
    totals, train_values, inference_values = _StepTotals(), [], []
    for micro in batch.micro_batches:
        loss, metrics = compute_grpo_loss(model, micro.to(config.device),
                                          gradient_accumulation_steps=config.gradient_accumulation_steps,
                                          clip_eps=config.clip_eps, kl_coef=config.kl_coef,
                                          missing_logprobs=config.missing_logprobs)
        loss.backward()
        totals.add(float(loss.detach()), metrics)
        train_values.append(metrics["training_logprobs"])
        inference_values.append(metrics["inference_logprobs"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, max_norm=MAX_GRAD_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    count = max(len(batch.micro_batches), 1)
    return {
        "loss": totals.loss, "lr": lr, "grad_norm": float(grad_norm),
        "pos_logp": totals.pos_logp_sum / totals.pos_count if totals.pos_count else 0.0,
        "neg_logp": totals.neg_logp_sum / totals.neg_count if totals.neg_count else 0.0,
        "pos_count": totals.pos_count, "neg_count": totals.neg_count,
        "mean_ratio": totals.mean_ratio / count, "clipped_fraction": totals.clipped_fraction / count,
        "num_sequences": batch.num_sequences, "num_tokens": batch.num_tokens,
        **_spread("logprobs/training", train_values), **_spread("logprobs/inference", inference_values),
        "alignment/diff_mean": totals.diff_mean / count, "alignment/diff_abs_mean": totals.diff_abs_mean / count,
        "alignment/diff_max": totals.diff_max,
    }


# --- logging ---------------------------------------------------------------------------

def setup_wandb(config: TrainingConfig) -> bool:
    """Start W&B when asked for (offline without an API key); whether it is logging."""
    if not config.use_wandb:
        return False
    if not config.wandb_project:
        print("W&B: --use-wandb needs --wandb-project; metrics go to the console only", flush=True)
        return False
    if not config.wandb_group:
        config.wandb_group = "".join(random.choices(string.ascii_letters + string.digits, k=8))
    _wandb.start(config.wandb_project, config.wandb_group, None, config.model_dump())
    return _wandb.active


def wandb_metrics(metrics: dict[str, Any], extra_metrics: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A step's metrics under Atropos's W&B names."""
    logged = {"train/loss": metrics["loss"], "train/grad_norm": metrics["grad_norm"],
              "train/lr": metrics.get("lr", 0.0), "train/pos_logp": metrics.get("pos_logp", 0.0),
              "train/neg_logp": metrics.get("neg_logp", 0.0),
              "grpo/mean_ratio": metrics.get("mean_ratio", 1.0),
              "grpo/clipped_fraction": metrics.get("clipped_fraction", 0.0)}
    logged.update({f"train/{key}": metrics[key] for key in TIMING_KEYS if key in metrics})
    logged.update({key: value for key, value in metrics.items() if "/" in key})
    logged.update(extra_metrics or {})
    return logged


def console_line(metrics: dict[str, Any], step: int, benchmark: bool = False) -> str:
    """One readable line summarising a step."""
    parts = [f"step {step}", f"loss {metrics['loss']:.4g}", f"grad norm {metrics['grad_norm']:.3f}",
             f"lr {metrics.get('lr', 0.0):.2e}", f"ratio {metrics.get('mean_ratio', 1.0):.3f}",
             f"clipped {100 * metrics.get('clipped_fraction', 0.0):.1f}%",
             f"advantages +{metrics.get('pos_count', 0)}/-{metrics.get('neg_count', 0)}",
             f"logp pos {metrics.get('pos_logp', 0.0):.3f} neg {metrics.get('neg_logp', 0.0):.3f}"]
    if "mean_score" in metrics:
        parts.append(f"batch score {metrics['mean_score']:+.3f}")
    if "step_time" in metrics:
        parts.append(f"took {metrics['step_time']:.1f}s")
    if benchmark:
        parts += [f"{label} {metrics[key]:.2f}{unit}" for key, label, unit in
                  (("sync_time", "sync", "s"), ("data_fetch_time", "data", "s"), ("gpu_memory_gb", "GPU mem", " GB"))
                  if key in metrics]
    return " | ".join(parts)


def log_metrics(metrics: dict[str, Any], step: int, use_wandb: bool, extra_metrics: Optional[dict] = None,
                benchmark: bool = False) -> None:
    """Print the step's line and, when W&B is on, log its metrics at `step`."""
    print(console_line(metrics, step, benchmark), flush=True)
    if use_wandb:
        _wandb.log(wandb_metrics(metrics, extra_metrics), step=step)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def finalize_training(use_wandb: bool, training_start_time: Optional[float] = None, mode: str = "unknown",
                      total_steps: int = 0, benchmark_stats: Optional[dict] = None, benchmark: bool = False) -> None:
    """Print the run's summary (a timing table with `benchmark`) and close W&B."""
    stats = benchmark_stats or {}
    total = time.time() - training_start_time if training_start_time is not None else 0.0
    peak_gb = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0
    summary = {"benchmark/total_time_seconds": total, "benchmark/total_time_minutes": total / 60,
               "benchmark/mode": mode, "benchmark/total_steps": total_steps,
               "benchmark/avg_step_time_seconds": _mean(stats.get("step_times", [])),
               "benchmark/peak_gpu_memory_gb": peak_gb,
               "benchmark/avg_gpu_memory_gb": _mean(stats.get("gpu_memories", []))}
    print(f"Training finished: {total_steps} steps in {total:.1f} s ({mode})", flush=True)
    if benchmark:
        rows = [("avg step time", _mean(stats.get("step_times", [])), "s"),
                ("total step time", sum(stats.get("step_times", [])), "s"),
                (f"avg sync time (x{len(stats.get('sync_times', []))})", _mean(stats.get("sync_times", [])), "s"),
                ("total sync time", sum(stats.get("sync_times", [])), "s"),
                ("avg data fetch time", _mean(stats.get("data_fetch_times", [])), "s"),
                ("total data fetch time", sum(stats.get("data_fetch_times", [])), "s"),
                ("peak GPU memory", peak_gb, " GB"), ("avg GPU memory", summary["benchmark/avg_gpu_memory_gb"], " GB")]
        print("\n".join(f"  {label:<28}{value:10.2f}{unit}" for label, value, unit in rows), flush=True)
    if use_wandb and _wandb.active:
        import wandb

        if wandb.run is not None:
            wandb.run.summary.update(summary)
        _wandb.finish()
