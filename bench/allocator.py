"""One GRPO training step on a CPU with glibc's allocator against tcmalloc (and jemalloc), in one run.

    .venv/bin/python bench/allocator.py --steps 4

Each allocator trains SmolLM2-135M-Instruct in a process of its own (the allocator is chosen
when a process starts: ``LD_PRELOAD``), in the dtype the trainer picks on this CPU, on
batches shaped like the race against TRL (`bench/trl_compare.py`): 32 rollouts in groups of
8 after a 47-token prompt, micro-batches of 8. The processes take turns, step by step, so a
noisy machine slows them alike; the first step of each warms up. Printed and written to
``docs/results/allocator.json``: the median step time, the page faults and kernel CPU time
per step, and the speed-up over glibc. Allocators that are not installed are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def worker(args: argparse.Namespace) -> None:
    """Train one step per index read from stdin; answer each with a JSON line of its costs."""
    sys.path.insert(0, str(ROOT / "bench"))
    from train_step import batch_items

    from atroposlib.local.allocator import loaded_allocator
    from atroposlib.local.prepare_model import prepare_model
    from example_trainer.config import TrainingConfig
    from example_trainer.data import prepare_batch
    from example_trainer.model import load_model_and_tokenizer
    from example_trainer.optim import create_optimizer
    from example_trainer.training import run_training_step

    config = TrainingConfig(model_name=str(prepare_model()), device="cpu", optimizer="adamw", lr=1e-5,
                            batch_size=args.micro_batch, seq_len=512)
    model, _ = load_model_and_tokenizer(config)
    optimizer = create_optimizer(model, config)
    print(json.dumps({"ready": True, "loaded": loaded_allocator()}), flush=True)
    for line in sys.stdin:
        index = int(line)
        items = batch_items(index, args.rollouts, args.group_size, model.config.vocab_size, args.prompt_tokens)
        batch = prepare_batch(items, config.batch_size, pad_multiple=config.pad_multiple, pack=True,
                              share_prefix=config.shares_prompt_prefix)
        before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        run_training_step(model, optimizer, batch, config, index)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({"seconds": seconds, "faults": after.ru_minflt - before.ru_minflt,
                          "kernel_seconds": after.ru_stime - before.ru_stime}), flush=True)


class Contender:
    """A worker process running with one allocator preloaded (None: glibc's)."""

    def __init__(self, name: str, library: Optional[str], args: argparse.Namespace) -> None:
        self.name = name
        env = {key: value for key, value in os.environ.items()
               if key not in ("LD_PRELOAD", "ATROPOS_PRELOADED_ALLOCATOR")}
        if library is not None:
            env["LD_PRELOAD"] = library
        command = [sys.executable, __file__, "--worker", "--rollouts", str(args.rollouts), "--group-size",
                   str(args.group_size), "--micro-batch", str(args.micro_batch), "--prompt-tokens",
                   str(args.prompt_tokens)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.steps: list[dict[str, float]] = []
        self.loaded = self._answer()["loaded"]

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:  # the model loader prints a line of its own
            if line.startswith("{"):
                return json.loads(line)
        raise SystemExit(f"the {self.name} worker ended (exit status {self.process.wait()})")

    def step(self, index: int) -> dict[str, float]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{index}\n")
        self.process.stdin.flush()
        self.steps.append(self._answer())
        return self.steps[-1]

    def summary(self) -> dict[str, Any]:
        timed = self.steps[1:] or self.steps  # the first step warms up
        return {"library": self.loaded, **{key: statistics.median(step[key] for step in timed)
                                           for key in ("seconds", "faults", "kernel_seconds")}}

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per allocator (after one warm-up step)")
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward pass")
    parser.add_argument("--prompt-tokens", type=int, default=47, help="tokens of each group's prompt")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "allocator.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import ctypes.util

    from atroposlib.local.allocator import find_library
    from atroposlib.local.cpu import read_cpu

    cpu = read_cpu()
    libraries = {"glibc (system)": None, "tcmalloc": find_library(),
                 "jemalloc (default settings)": ctypes.util.find_library("jemalloc")}
    contenders = [Contender(name, library, args) for name, library in libraries.items()
                  if name.startswith("glibc") or library is not None]
    print(f"{cpu.model_name}, {os.cpu_count()} cores; allocators: {', '.join(c.name for c in contenders)}",
          flush=True)
    try:
        for index in range(args.steps + 1):
            for contender in contenders:
                step = contender.step(index)
                print(f"step {index} {contender.name}: {step['seconds']:.2f} s, {step['faults']:,} page faults, "
                      f"{step['kernel_seconds']:.2f} s in the kernel", flush=True)
    finally:
        for contender in contenders:
            contender.close()
    results = {contender.name: contender.summary() for contender in contenders}
    baseline = results["glibc (system)"]["seconds"]
    for name, result in results.items():
        result["speedup"] = baseline / result["seconds"]
        print(f"{name}: {result['seconds']:.2f} s per step, {result['faults']:,.0f} page faults, "
              f"{result['kernel_seconds']:.2f} s in the kernel, {result['speedup']:.2f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"cpu": cpu.model_name, "cores": os.cpu_count(),
                                     "bf16_flags": sorted(flag for flag in cpu.flags if "bf16" in flag),
                                     "settings": {key: value for key, value in vars(args).items()
                                                  if key not in ("worker", "json")},
                                     "results": results}, indent=1))


if __name__ == "__main__":
    main()
