"""A few training steps on fixed batches, at whatever world size it is launched with.

    python -m torch.distributed.run --nproc-per-node 2 tests/example_trainer/distributed_steps.py \
        --model DIR --out results.pt plan.json

The plan is a JSON object from a run's name to its options (``["--data-parallel", "fsdp",
"--steps", "3"]``); the runs take turns in one launch, so that the processes' start (torch,
transformers, the process group) is paid once rather than once a run. Every rank builds the
same batches (groups of different sizes and lengths, so that the ranks' shares differ in size),
trains its share with `run_training_step`, and rank 0 writes each run's full weights and
per-step losses to ``--out``, by name: the tests compare runs at world sizes 1 and 2.
``--save-at`` writes a checkpoint (through `trainers.save`) after that step and stops;
``--resume`` starts from one, as ``--resume-from`` does; ``--dtype`` and ``--lr`` set the
compute dtype and the AdamW learning rate.

``--gradient-cases`` instead takes, for each loss setting of `GRADIENT_CASES`, one step of
plain SGD at learning rate 1 without clipping from the starting weights, on batches with
off-policy sampler log-probabilities and top-p sampling: the weights' change is minus the
gradient of the whole batch, which a scale error in combining the ranks would change (AdamW
would hide it: its update barely depends on a uniform gradient scale).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import torch

from example_trainer import distributed, training
from example_trainer.checkpointing import load_resume_state, restore_optimizer_and_rng
from example_trainer.config import TrainingConfig
from example_trainer.data import prepare_batch
from example_trainer.model import load_model_and_tokenizer
from example_trainer.optim import create_optimizer
from example_trainer.trainers import Run, save
from example_trainer.training import run_training_step
from example_trainer.weight_sync import FollowerSync

GROUP_SIZES = (3, 2)  # five rollouts: ranks of a world of two get three and two
# The loss settings whose one-step gradients must not depend on the number of ranks.
GRADIENT_CASES: dict[str, dict[str, Any]] = {
    "grpo": {"loss_type": "grpo", "kl_coef": 0.05},
    "dr_grpo": {"loss_type": "dr_grpo", "kl_coef": 0.05},
    "dapo": {"loss_type": "dapo", "kl_coef": 0.05, "epsilon_high": 0.28},
    "gspo": {"loss_type": "gspo"},
    "grpo_tis": {"loss_type": "grpo", "tis_cap": 2.0},
    "dapo_tis": {"loss_type": "dapo", "tis_cap": 2.0, "dual_clip": 3.0},
}


def batch_items(step: int, off_policy: bool = False) -> list[dict[str, Any]]:
    """The groups of step `step`: the same on every rank and in every run. `off_policy` adds
    sampler log-probabilities unlike the model's and top-p sampling at temperature 0.8."""
    rng = random.Random(step)
    items = []
    for size in GROUP_SIZES:
        lengths = [rng.randint(6, 14) for _ in range(size)]
        tokens = [[rng.randint(1, 300) for _ in range(length)] for length in lengths]
        masks = [[-100] * 3 + row[3:] for row in tokens]
        item: dict[str, Any] = {"tokens": tokens, "masks": masks,
                                "scores": [rng.choice([0.0, 0.5, 1.0]) for _ in lengths]}
        if off_policy:
            item["inference_logprobs"] = [[1.0] * 3 + [-rng.uniform(5.6, 6.1) for _ in row[3:]] for row in tokens]
            item["generation_params"] = {"temperature": 0.8, "top_p": 0.9}
        items.append(item)
    return items


def gradient_cases(args: argparse.Namespace, ranks: distributed.Ranks) -> dict[str, dict[str, torch.Tensor]]:
    """Each case's weight change after one SGD step at learning rate 1, unclipped (rank 0's)."""
    clipped_at, training.MAX_GRAD_NORM = training.MAX_GRAD_NORM, float("inf")
    changes = {}
    try:
        for name, options in GRADIENT_CASES.items():
            config = TrainingConfig(model_name=args.model, device="cpu", dtype=args.dtype, batch_size=2,
                                    gradient_accumulation_steps=2, seq_len=64, data_parallel=args.data_parallel,
                                    **options)
            model, _ = load_model_and_tokenizer(config)
            before = {key: value.detach().clone() for key, value in model.state_dict().items()}
            model = distributed.wrap(model, config, ranks)
            batch = prepare_batch(batch_items(0, off_policy=True), config.batch_size, pack=True, pad_multiple=1,
                                  rank=ranks.rank, world_size=ranks.world_size)
            run_training_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, config, 0, ranks=ranks)
            after = distributed.full_model_state(model, ranks) if ranks.distributed else model.state_dict()
            if ranks.is_main:
                changes[name] = {key: after[key].float() - before[key].float() for key in before}
    finally:
        training.MAX_GRAD_NORM = clipped_at
    return changes


def run_parser() -> argparse.ArgumentParser:
    """The options of one run of the plan."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-parallel", default="ddp")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--save-path", default="")
    parser.add_argument("--resume", default="")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--gradient-cases", action="store_true")
    return parser


def train(args: argparse.Namespace, ranks: distributed.Ranks) -> dict[str, Any]:
    """Train `args.steps` AdamW steps (or up to `--save-at`, then save); the full weights and the
    losses (rank 0's)."""
    config = TrainingConfig(model_name=args.model, device="cpu", dtype=args.dtype, optimizer="adamw",
                            lr=args.lr, batch_size=2, gradient_accumulation_steps=2, seq_len=64,
                            data_parallel=args.data_parallel, save_path=args.save_path or "unused",
                            resume_from=args.resume or None)
    model, tokenizer = load_model_and_tokenizer(config)
    model = distributed.wrap(model, config, ranks)
    optimizer = create_optimizer(model, config)
    first = 0
    if args.resume:
        first = load_resume_state(args.resume).step
        restore_optimizer_and_rng(args.resume, optimizer, model)
    losses = []
    for step in range(first, args.steps):
        batch = prepare_batch(batch_items(step), config.batch_size, pack=True, pad_multiple=1,
                              rank=ranks.rank, world_size=ranks.world_size)
        losses.append(run_training_step(model, optimizer, batch, config, step, ranks=ranks)["loss"])
        if step + 1 == args.save_at:
            save(Run(config, model, tokenizer, optimizer, FollowerSync(config), None, False, ranks=ranks), args.save_at)
            break
    weights = distributed.full_model_state(model, ranks) or model.state_dict()
    return {"weights": weights, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("plan", help="a JSON file: each run's name and its options")
    launch = parser.parse_args()
    plan: dict[str, list[str]] = json.loads(Path(launch.plan).read_text())
    ranks = distributed.start(TrainingConfig(model_name=launch.model, device="cpu"))
    results = {}
    try:
        for name, options in plan.items():
            args = run_parser().parse_args(options, argparse.Namespace(model=launch.model))
            torch.manual_seed(0)
            results[name] = {"changes": gradient_cases(args, ranks)} if args.gradient_cases else train(args, ranks)
        if ranks.is_main:
            torch.save(results, launch.out)
    finally:
        distributed.stop(ranks)


if __name__ == "__main__":
    main()
