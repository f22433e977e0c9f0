"""TRL's GRPOTrainer on the learning demo's task, against this project's run of it.

What a TRL user gets on a CPU: `trl.GRPOTrainer` generating with Hugging Face ``generate``,
on the same model (SmolLM2-135M-Instruct, float32), prompts (the training pairs of
``environments/small_sums_task.py``, drawn in the environment's order), reward, group size,
batch, learning rate and optimizer (AdamW, weight decay 0.01, gradient norm clipped to 1),
``loss_type="grpo"``, ``beta=0``, temperature 0.7 and answer length; everything else is TRL's
default (gradient checkpointing included), as a TRL user gets it. It runs in a virtual
environment of its own (``bench/setup_trl.sh``), saves a checkpoint every ``--eval-every``
steps, and its checkpoints are then evaluated exactly as ``bench/learning_demo.py`` evaluates
this project's (held-out pairs, same sampling, one vLLM reloaded in place).

Run it after ``bench/learning_demo.py`` with the same settings on the same otherwise idle
machine; it reads the demo's figures (``--ours``), then prints wall time per step for both,
held-out accuracy against wall time, and how long each took to reach TRL's final accuracy.

    bash bench/setup_trl.sh .cache/trlvenv
    .venv/bin/python bench/trl_compare.py --trl-python .cache/trlvenv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
TASK_DIR = ROOT / "environments"


# --- the TRL side: runs in TRL's virtual environment, which has no atroposlib ------------------

def trl_worker(args: argparse.Namespace) -> None:
    """Train with TRL's GRPOTrainer; one JSON line per logged step (wall seconds since the
    trainer was built) in ``<out>/steps.jsonl``, checkpoints in ``<out>/checkpoint-N``."""
    sys.path.insert(0, str(TASK_DIR))
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from small_sums_task import messages, score, split_pairs

    torch.manual_seed(args.seed)
    train_pairs, _ = split_pairs(args.eval_pairs, args.split_seed)
    rng = random.Random(args.seed)  # the environment's draw: rng.choice over the training pairs
    pairs = [rng.choice(train_pairs) for _ in range(args.steps * args.groups_per_step)]
    dataset = Dataset.from_list([{"prompt": messages(a, b), "answer": a + b} for a, b in pairs])

    def reward(completions: list[Any], answer: list[int], **_: Any) -> list[float]:
        return [score(completion[0]["content"], gold) for completion, gold in zip(completions, answer)]

    out = Path(args.out)
    config = GRPOConfig(
        output_dir=str(out), max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant",
        weight_decay=0.01, max_grad_norm=1.0, optim="adamw_torch", seed=args.seed,
        per_device_train_batch_size=args.group_size * args.groups_per_step, gradient_accumulation_steps=1,
        num_generations=args.group_size, max_completion_length=args.max_answer_tokens,
        temperature=args.temperature, top_p=1.0, top_k=0, loss_type="grpo", beta=0.0, epsilon=0.2,
        scale_rewards="group", num_iterations=1, shuffle_dataset=False, use_cpu=True, bf16=False, fp16=False,
        logging_steps=1, save_strategy="steps", save_steps=args.eval_every,
        save_only_model=True, report_to="none", disable_tqdm=True)
    started = time.monotonic()

    class WallClock(TrainerCallback):
        def on_log(self, _args: Any, state: Any, _control: Any, logs: Optional[dict] = None, **_: Any) -> None:
            if logs and "reward" in logs:
                with (out / "steps.jsonl").open("a") as file:
                    file.write(json.dumps({"step": state.global_step, "seconds": time.monotonic() - started,
                                           "reward": logs["reward"]}) + "\n")
                print(f"TRL step {state.global_step}: reward {logs['reward']:.3f}, "
                      f"{time.monotonic() - started:.0f} s", flush=True)

    out.mkdir(parents=True, exist_ok=True)
    trainer = GRPOTrainer(model=args.model, reward_funcs=reward, args=config, train_dataset=dataset,
                          callbacks=[WallClock()])
    trainer.train()
    trainer.save_model(str(out / "final_model"))
    (out / "total_seconds").write_text(str(time.monotonic() - started))


# --- the comparing side: runs in this project's virtual environment ----------------------------

def run_trl(args: argparse.Namespace, model: Path, out: Path) -> float:
    """TRL's training in its own python; the wall seconds from its launch to its end."""
    started = time.monotonic()
    command = [args.trl_python, __file__, "--trl-worker", "--model", str(model), "--out", str(out),
               *(f"--{name.replace('_', '-')}={value}" for name, value in vars(args).items()
                 if name in SHARED)]
    subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    return time.monotonic() - started


def trl_checkpoints(out: Path, steps: int, eval_every: int) -> list[tuple[int, Path]]:
    found = [(int(path.name.split("-")[1]), path) for path in out.glob("checkpoint-*")]
    found = [(step, path) for step, path in found if step % eval_every == 0]
    return sorted(found) + ([(steps, out / "final_model")] if steps % eval_every else [])


def reach_time(curve: list[tuple[float, float]], target: float) -> Optional[float]:
    """The first wall time at which `curve` ((seconds, accuracy) points) reaches `target`,
    interpolated linearly between evaluated checkpoints; None when it never does."""
    for (t0, a0), (t1, a1) in zip(curve, curve[1:]):
        if a1 >= target:
            return t0 if a0 >= target else t0 + (t1 - t0) * (target - a0) / (a1 - a0)
    return curve[0][0] if curve and curve[0][1] >= target else None


def compare(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from atroposlib.local.cpu import read_cpu
    from atroposlib.local.prepare_model import prepare_model
    from atroposlib.local.vllm_service import LocalVLLM
    from bench.learning_demo import evaluate

    ours = json.loads(Path(args.ours).read_text())
    cpu = read_cpu().model_name
    if ours["cpu"] != cpu:
        raise SystemExit(f"the demo's figures come from {ours['cpu']}, this machine is {cpu}: run both here")
    for name in SHARED:
        if name in ours["settings"] and ours["settings"][name] != getattr(args, name):
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)} differs from the demo's "
                             f"{ours['settings'][name]}: compare like with like")
    model = prepare_model()
    work = Path(tempfile.mkdtemp(prefix="trl-compare-"))
    try:
        trl_seconds = run_trl(args, model, work / "trl")
        steps = [json.loads(line) for line in (work / "trl" / "steps.jsonl").read_text().splitlines()]
        wall = {row["step"]: row["seconds"] for row in steps}
        curve = []
        with LocalVLLM(model, dtype="float32", max_model_len=512, log_path=work / "eval-vllm.log") as server:
            for step, weights in [(0, model)] + trl_checkpoints(work / "trl", args.steps, args.eval_every):
                if step:
                    server.reload_weights(weights, policy_version=step)
                accuracy, answers = evaluate(server, model, work, args)
                curve.append({"step": step, "seconds": wall.get(step, 0.0), "accuracy": accuracy})
                print(f"TRL held-out accuracy after step {step}: {accuracy:.3f} ({answers} answers)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"cpu": cpu, "settings": {name: getattr(args, name) for name in SHARED},
              "trl": {"seconds": trl_seconds, "steps": steps, "evaluations": curve},
              "ours": {"seconds": ours["training_seconds"], "evaluations": ours["evaluations"]}}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(summary(report))


def summary(report: dict[str, Any]) -> str:
    trl, ours = report["trl"], report["ours"]
    target = trl["evaluations"][-1]["accuracy"]
    trl_curve = [(e["seconds"], e["accuracy"]) for e in trl["evaluations"]]
    our_curve = [(e["seconds"], e["accuracy"]) for e in ours["evaluations"]]
    ours_at = reach_time(our_curve, target)
    trl_at = reach_time(trl_curve, target)
    steps = report["settings"]["steps"]
    lines = [f"{report['cpu']}: {steps} steps of {report['settings']['groups_per_step']} x "
             f"{report['settings']['group_size']} rollouts each",
             f"wall time per step: this project {ours['seconds'] / steps:.1f} s, TRL {trl['seconds'] / steps:.1f} s",
             f"held-out accuracy at the start {trl['evaluations'][0]['accuracy']:.3f}; at the end: this project "
             f"{ours['evaluations'][-1]['accuracy']:.3f}, TRL {target:.3f}"]
    if ours_at is not None and trl_at is not None:
        lines.append(f"time to reach TRL's final held-out accuracy {target:.3f}: this project {ours_at / 60:.1f} min, "
                     f"TRL {trl_at / 60:.1f} min ({ours_at / max(trl_at, 1e-9):.2f} of TRL's)")
    else:
        lines.append(f"this project did not reach TRL's final held-out accuracy {target:.3f}")
    return "\n".join(lines)


SHARED = ("steps", "lr", "group_size", "groups_per_step", "temperature", "eval_every", "eval_samples",
          "eval_pairs", "split_seed", "seed", "max_answer_tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trl-python", default=str(ROOT / ".cache" / "trlvenv" / "bin" / "python"),
                        help="python of the TRL environment (bench/setup_trl.sh)")
    parser.add_argument("--ours", default=str(ROOT / "docs" / "results" / "learning_demo.json"),
                        help="the figures bench/learning_demo.py wrote")
    parser.add_argument("--json", default=str(ROOT / "docs" / "results" / "trl_compare.json"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--eval-pairs", type=int, default=30)
    parser.add_argument("--split-seed", type=int, default=1234)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-answer-tokens", type=int, default=32)
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
