"""How much of each AdamW update survives, and what a step costs, by precision, in the same run.

    .venv/bin/python bench/precision.py [--steps 3] [--lr 1e-5]

SmolLM2-135M-Instruct (the bundled model) trains ``--steps`` GRPO steps on the same batches
(`bench/train_step.py`'s: 16 rollouts of a 36-token prompt and a 4-32-token answer) three ways,
taking turns step by step so that a noisy machine slows all alike:

* ``float32``: weights, optimizer and compute in float32 (the reference update);
* ``bfloat16 weights (Atropos)``: the model loaded in bfloat16 and AdamW stepping those
  weights in place, as Atropos's trainer (and this one before it kept master weights) does;
* ``bfloat16 compute, float32 masters`` (this project's ``--dtype bfloat16``): autocast over
  float32 weights and optimizer state (`example_trainer.precision`).

For each it prints the share of weights the steps changed, the norm of the update against
float32's and their cosine, and the median step time (after the first), and writes them to
``docs/results/precision.json``. On CPUs without bf16 instructions bfloat16 is several times
slower than float32 (`atroposlib.local.cpu`); the CPU is named in the output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.train_step import batch_items  # noqa: E402

SETTINGS = {"float32": "float32", "bfloat16 weights (Atropos)": "bfloat16",
            "bfloat16 compute, float32 masters": "bfloat16"}
REFERENCE = "float32"


class Setting:
    """One way of holding the weights: its model, optimizer, step times and starting weights."""

    def __init__(self, name: str, model_dir: Path, args: argparse.Namespace) -> None:
        import torch

        from example_trainer.config import TrainingConfig
        from example_trainer.model import load_model_and_tokenizer
        from example_trainer.optim import create_optimizer

        self.name = name
        self.config = TrainingConfig(model_name=str(model_dir), device="cpu", dtype=SETTINGS[name],
                                     optimizer="adamw", lr=args.lr, batch_size=args.batch_size, seq_len=512)
        self.model, _ = load_model_and_tokenizer(self.config)
        if name.startswith("bfloat16 weights"):
            self.model.to(torch.bfloat16)  # no master copy: AdamW steps the bfloat16 weights themselves
        self.start = {key: value.detach().float().clone() for key, value in self.model.state_dict().items()}
        self.optimizer = create_optimizer(self.model, self.config)
        self.times: list[float] = []

    def step(self, index: int, items: list[dict[str, Any]]) -> None:
        from example_trainer.data import prepare_batch
        from example_trainer.training import run_training_step

        batch = prepare_batch(items, self.config.batch_size, pad_multiple=1, pack=True)
        started = time.perf_counter()
        run_training_step(self.model, self.optimizer, batch, self.config, index)
        self.times.append(time.perf_counter() - started)

    def update(self) -> Any:
        import torch

        state = self.model.state_dict()
        # float64: a float32 cosine over 135M elements is off by a few percent
        return torch.cat([(state[key].double() - start).flatten() for key, start in self.start.items()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per setting")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8, help="micro-batch size")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "precision.json")
    args = parser.parse_args()
    import torch

    from atroposlib.local.cpu import read_cpu
    from atroposlib.local.prepare_model import prepare_model

    model_dir = prepare_model()
    cpu = read_cpu()
    bf16 = sorted(flag for flag in cpu.flags if flag in ("avx512_bf16", "amx_bf16"))
    print(f"{cpu.model_name} ({', '.join(bf16) or 'no bf16 instructions'}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}", flush=True)
    settings = [Setting(name, model_dir, args) for name in SETTINGS]
    vocab = settings[0].model.config.vocab_size
    for index in range(args.steps):
        items = batch_items(index, args.rollouts, args.group_size, vocab)
        for setting in settings:
            setting.step(index, items)
            print(f"step {index + 1} {setting.name}: {setting.times[-1]:.2f} s", flush=True)
    reference = settings[0].update()
    results = {}
    for setting in settings:
        update = setting.update()
        results[setting.name] = {
            "changed_fraction": float((update != 0).float().mean()),
            "update_norm_ratio": float(update.norm() / reference.norm()),
            "cosine_with_float32": float(torch.nn.functional.cosine_similarity(update, reference, dim=0)),
            "step_seconds": statistics.median(setting.times[1:] or setting.times)}
        row = results[setting.name]
        print(f"{setting.name}: {100 * row['changed_fraction']:.1f}% of weights changed, update norm "
              f"{row['update_norm_ratio']:.2f}x float32's, cosine {row['cosine_with_float32']:.3f}, "
              f"{row['step_seconds']:.2f} s per step", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"cpu": cpu.model_name, "bf16_instructions": bf16,
                                     "settings": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                    indent=1))
    print(f"figures: {args.json}")


if __name__ == "__main__":
    main()
