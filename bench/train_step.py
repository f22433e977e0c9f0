"""One GRPO training step on a CPU: Atropos's way against this project's, in the same run.

    .venv/bin/python bench/train_step.py --steps 3

SmolLM2-135M-Instruct (the bundled model) in float32 trains on batches shaped like the brevity
task's: 16 rollouts of a 36-token prompt and a 4-32-token answer, micro-batches of 4. Three
settings take turns, step by step, so that a noisy machine slows them alike:

* ``atropos``: every rollout padded to the batch's longest, rounded up to a multiple of 64;
  gradient checkpointing on; the LM head over every position;
* ``this project`` (the CPU defaults): micro-batches of one group each, whose shared prompt
  runs once (`example_trainer.prefix_sharing`), padded to their own longest; no gradient
  checkpointing; the LM head only at trained positions;
* ``this project, rows whole`` (``--no-share-prompt-prefix``): the same, but micro-batches
  sorted by length across groups and every row run whole, prompt included.

A prompt is shared only where that saves enough positions to pay for its own forward pass
(`example_trainer.prefix_sharing.MIN_POSITIONS_SAVED`): not at the default shape (4 rows of a
36-token prompt), where the two rows of this project match; ``--rollouts 32 --batch-size 8
--prompt-tokens 47`` is the shape of the race against TRL (`bench/trl_compare.py`).

It prints the median step time and positions/s of each (a position is a token slot the
forward pass computes, padding included, as the trainer counts it) and the speed-up, and
writes them to ``docs/results/train_step.json``. The trainer's vLLM pausing during steps
(``--vllm-pause-during-train``) is not part of this measurement: no vLLM runs here.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT_TOKENS = 36


def batch_items(step: int, rollouts: int, group_size: int, vocab: int,
                prompt_tokens: int = PROMPT_TOKENS) -> list[dict[str, Any]]:
    """The step's groups: a shared prompt per group, answers of 4 to 32 tokens, mixed scores."""
    rng = random.Random(step)
    items = []
    for _ in range(rollouts // group_size):
        prompt = [rng.randrange(10, vocab) for _ in range(prompt_tokens)]
        answers = [[rng.randrange(10, vocab) for _ in range(rng.randint(4, 32))] for _ in range(group_size)]
        items.append({"tokens": [prompt + answer for answer in answers],
                      "masks": [[-100] * prompt_tokens + answer for answer in answers],
                      "scores": [rng.choice([0.0, 1.0]) for _ in answers]})
    return items


class Setting:
    """A way of training the step: its model (loaded once) and how batches are laid out."""

    def __init__(self, name: str, model_dir: Path, args: argparse.Namespace, atropos: bool,
                 share_prefix: bool = False) -> None:
        from example_trainer.config import TrainingConfig
        from example_trainer.model import load_model_and_tokenizer
        from example_trainer.optim import create_optimizer

        self.name, self.atropos, self.share_prefix = name, atropos, share_prefix
        self.config = TrainingConfig(model_name=str(model_dir), device="cpu", dtype="float32", optimizer="adamw",
                                     lr=1e-6, batch_size=args.batch_size, seq_len=512,
                                     gradient_checkpointing=atropos, pad_to_multiple=64 if atropos else 1)
        self.model, _ = load_model_and_tokenizer(self.config)
        self.optimizer = create_optimizer(self.model, self.config)
        self.times: list[float] = []
        self.positions: list[int] = []

    def step(self, index: int, items: list[dict[str, Any]]) -> None:
        from example_trainer import logprobs
        from example_trainer.data import prepare_batch
        from example_trainer.training import run_training_step

        batch = prepare_batch(items, self.config.batch_size, pad_multiple=self.config.pad_multiple,
                              pack=not self.atropos, share_prefix=self.share_prefix)
        head_at_trained_positions = logprobs.LOGITS_TO_KEEP_MASKS
        logprobs.LOGITS_TO_KEEP_MASKS = head_at_trained_positions and not self.atropos
        try:
            started = time.perf_counter()
            run_training_step(self.model, self.optimizer, batch, self.config, index)
            self.times.append(time.perf_counter() - started)
        finally:
            logprobs.LOGITS_TO_KEEP_MASKS = head_at_trained_positions
        self.positions.append(batch.positions)

    def summary(self) -> dict[str, float]:
        times = self.times[1:] or self.times  # the first step warms up
        positions = self.positions[1:] or self.positions
        seconds = statistics.median(times)
        return {"step_seconds": seconds, "positions": statistics.median(positions),
                "positions_per_s": statistics.median(p / t for p, t in zip(positions, times))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per setting (after one warm-up step)")
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4, help="micro-batch size")
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help="tokens of each group's prompt")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "train_step.json")
    args = parser.parse_args()
    import torch

    from atroposlib.local.cpu import read_cpu
    from atroposlib.local.prepare_model import prepare_model

    model_dir = prepare_model()
    cpu = read_cpu().model_name
    print(f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    settings = [Setting("atropos", model_dir, args, atropos=True),
                Setting("this project", model_dir, args, atropos=False, share_prefix=True),
                Setting("this project, rows whole", model_dir, args, atropos=False)]
    vocab = settings[0].model.config.vocab_size
    for index in range(args.steps + 1):
        items = batch_items(index, args.rollouts, args.group_size, vocab, args.prompt_tokens)
        for setting in settings:
            setting.step(index, items)
            print(f"step {index} {setting.name}: {setting.times[-1]:.2f} s, {setting.positions[-1]} positions",
                  flush=True)
    results = {setting.name: setting.summary() for setting in settings}
    speedup = results["atropos"]["step_seconds"] / results["this project"]["step_seconds"]
    sharing = results["this project, rows whole"]["step_seconds"] / results["this project"]["step_seconds"]
    for name, result in results.items():
        print(f"{name}: {result['step_seconds']:.2f} s per step, {result['positions']:.0f} positions, "
              f"{result['positions_per_s']:.0f} positions/s")
    print(f"speed-up: {speedup:.2f}x against Atropos's layout, {sharing:.2f}x from running each prompt once")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"cpu": cpu, "settings": vars(args) | {"json": str(args.json)},
                                     "results": results, "speedup": speedup, "prefix_sharing_speedup": sharing},
                                    indent=1))


if __name__ == "__main__":
    main()
