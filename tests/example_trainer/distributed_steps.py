"""A few training steps on fixed batches, at whatever world size it is launched with.

    python -m torch.distributed.run --nproc-per-node 2 tests/example_trainer/distributed_steps.py \
        --model DIR --out weights.pt --data-parallel fsdp --steps 3

Every rank builds the same batches (groups of different sizes and lengths, so that the ranks'
shares differ in size), trains its share with `run_training_step`, and rank 0 writes the full
weights and each step's loss to ``--out``: the tests compare runs at world sizes 1 and 2.
``--save-at`` writes a checkpoint (through `trainers.save`) after that step and stops;
``--resume`` starts from one, as ``--resume-from`` does.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import torch

from example_trainer import distributed
from example_trainer.checkpointing import load_resume_state, restore_optimizer_and_rng
from example_trainer.config import TrainingConfig
from example_trainer.data import prepare_batch
from example_trainer.model import load_model_and_tokenizer
from example_trainer.optim import create_optimizer
from example_trainer.trainers import Run, save
from example_trainer.training import run_training_step
from example_trainer.weight_sync import FollowerSync

GROUP_SIZES = (3, 2)  # five rollouts: ranks of a world of two get three and two


def batch_items(step: int) -> list[dict[str, Any]]:
    """The groups of step `step`: the same on every rank and in every run."""
    rng = random.Random(step)
    items = []
    for size in GROUP_SIZES:
        lengths = [rng.randint(6, 14) for _ in range(size)]
        tokens = [[rng.randint(1, 300) for _ in range(length)] for length in lengths]
        masks = [[-100] * 3 + row[3:] for row in tokens]
        items.append({"tokens": tokens, "masks": masks, "scores": [rng.choice([0.0, 0.5, 1.0]) for _ in lengths]})
    return items


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--data-parallel", default="ddp")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--save-path", default="")
    parser.add_argument("--resume", default="")
    args = parser.parse_args()
    config = TrainingConfig(model_name=args.model, device="cpu", dtype="float32", optimizer="adamw",
                            lr=1e-3, batch_size=2, gradient_accumulation_steps=2, seq_len=64,
                            data_parallel=args.data_parallel, save_path=args.save_path or "unused",
                            resume_from=args.resume or None)
    ranks = distributed.start(config)
    try:
        torch.manual_seed(0)
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
                run = Run(config, model, tokenizer, optimizer, FollowerSync(config), None, False, ranks=ranks)
                save(run, args.save_at)
                break
        weights = distributed.full_model_state(model, ranks) or model.state_dict()
        if ranks.is_main:
            torch.save({"weights": weights, "losses": losses}, args.out)
    finally:
        distributed.stop(ranks)


if __name__ == "__main__":
    main()
