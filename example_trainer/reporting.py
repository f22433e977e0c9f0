"""What a training run tells the person watching it: a console line per step, W&B metrics
under Atropos's names (so existing dashboards read them) and the end-of-run summary."""

from __future__ import annotations

import random
import string
import time
from typing import Any, Optional

import torch

from atroposlib.envs.wandb_logging import WandbRun
from example_trainer.config import TrainingConfig

TIMING_KEYS = ("step_time", "sync_time", "data_fetch_time", "checkpoint_time", "gpu_memory_gb",
               "gpu_memory_reserved_gb")
# Where a step's wall time goes, in the order it is spent: (metric, label on the step line).
STEP_BUDGET = (("data_fetch_time", "wait"), ("step_time", "train"), ("checkpoint_time", "save"),
               ("sync_time", "sync"))

_wandb = WandbRun()


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
    """A step's metrics under Atropos's W&B names (keys with a ``/`` are logged as they are)."""
    logged = {"train/loss": metrics["loss"], "train/grad_norm": metrics["grad_norm"],
              "train/lr": metrics.get("lr", 0.0), "train/pos_logp": metrics.get("pos_logp", 0.0),
              "train/neg_logp": metrics.get("neg_logp", 0.0),
              "grpo/mean_ratio": metrics.get("mean_ratio", 1.0),
              "grpo/clipped_fraction": metrics.get("clipped_fraction", 0.0)}
    logged.update({f"train/{key}": metrics[key] for key in TIMING_KEYS if key in metrics})
    logged.update({key: value for key, value in metrics.items() if "/" in key})
    logged.update(extra_metrics or {})
    return logged


def _staleness(metrics: dict[str, Any]) -> Optional[str]:
    unknown = metrics.get("staleness/unknown_groups", 0)
    if "staleness/mean" in metrics:
        known = f"staleness {metrics['staleness/mean']:.1f} (max {metrics['staleness/max']})"
        return known + (f", {unknown} groups unknown" if unknown else "")
    return "staleness unknown" if unknown else None


def console_line(metrics: dict[str, Any], step: int, benchmark: bool = False) -> str:
    """One readable line summarising a step."""
    parts = [f"step {step}", f"loss {metrics['loss']:.4g}", f"grad norm {metrics['grad_norm']:.3f}",
             f"lr {metrics.get('lr', 0.0):.2e}", f"ratio {metrics.get('mean_ratio', 1.0):.3f}",
             f"clipped {100 * metrics.get('clipped_fraction', 0.0):.1f}%"]
    if "grpo/clip_binding_fraction" in metrics:
        parts[-1] += f" (binds {100 * metrics['grpo/clip_binding_fraction']:.1f}%)"
    if "grpo/entropy" in metrics:
        parts.append(f"entropy {metrics['grpo/entropy']:.3f}")
    if "grpo/kl" in metrics:
        parts.append(f"kl {metrics['grpo/kl']:.2e}")
    staleness = _staleness(metrics)
    if staleness:
        parts.append(staleness)
    parts += [f"advantages +{metrics.get('pos_count', 0)}/-{metrics.get('neg_count', 0)}",
              f"logp pos {metrics.get('pos_logp', 0.0):.3f} neg {metrics.get('neg_logp', 0.0):.3f}"]
    if metrics.get("grpo/outside_truncation"):
        parts.append(f"{metrics['grpo/outside_truncation']} sampled tokens outside top-p/top-k/min-p scored "
                     "untruncated")
    if metrics.get("train/skipped_step"):
        parts.append("optimizer step SKIPPED (non-finite)")
    if metrics.get("train/too_long"):
        parts.append(f"{metrics['train/too_long']} rollouts over --seq-len left out")
    if "mean_score" in metrics:
        parts.append(f"batch score {metrics['mean_score']:+.3f}")
    if "step_time" in metrics:
        parts.append("time " + " + ".join(f"{label} {metrics[key]:.1f}s" for key, label in STEP_BUDGET
                                           if key in metrics))
        speeds = []
        if "train/tokens_per_s" in metrics:
            speeds.append(f"training {metrics['train/tokens_per_s']:.0f} positions/s")
        if "vllm/generation_tokens_per_s" in metrics:
            speeds.append(f"vLLM generated {metrics['vllm/generation_tokens_per_s']:.0f} tokens/s")
        if speeds:
            parts.append(", ".join(speeds))
    if benchmark and "gpu_memory_gb" in metrics:
        parts.append(f"GPU mem {metrics['gpu_memory_gb']:.2f} GB")
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
                ("avg checkpoint time", _mean(stats.get("checkpoint_times", [])), "s"),
                ("peak GPU memory", peak_gb, " GB"), ("avg GPU memory", summary["benchmark/avg_gpu_memory_gb"], " GB")]
        print("\n".join(f"  {label:<28}{value:10.2f}{unit}" for label, value, unit in rows), flush=True)
    if use_wandb and _wandb.active:
        import wandb

        if wandb.run is not None:
            wandb.run.summary.update(summary)
        _wandb.finish()
