"""GRPO learning on a CPU, shown on held-out data: SmolLM2-135M-Instruct on single-digit sums.

Runs what a user runs in three terminals — `run-api`, `atropos-grpo` (reload mode: it starts
the bundled vLLM and reads each new checkpoint into it in place) and
``environments/small_sums_env.py serve`` sampling from that vLLM at temperature 0.7 — for
``--steps`` steps, stops them, then evaluates the held-out sums (pairs never trained on,
same prompt and sampling: ``small_sums_env.py evaluate``) on the starting weights and on the
checkpoints every ``--eval-every`` steps, all through one vLLM server whose weights are
reloaded in place. Writes a PNG (batch reward per step, held-out accuracy per checkpoint
against wall time) and a JSON of every figure, and prints the summary: CPU, wall time,
training positions/s, generation tokens/s. Every process runs with its defaults: the trainer
computes in the dtype ``--dtype auto`` picks on this machine (float32 on a CPU without AMX)
with float32 master weights; the evaluation's vLLM serves the checkpoints in float32
(``--eval-dtype``), as they were trained. Needs the vLLM runtime (`atropos-vllm install`)
and the prepared model (`atropos-prepare-model`); no GPU, no internet. Not a CI test: on a
2-core CPU it takes up to an hour. Run it with the machine to itself.

    .venv/bin/python bench/learning_demo.py [--steps 30] [--lr 1e-5] [--png docs/images/learning_demo.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from atroposlib.local.cpu import DTYPES, read_cpu  # noqa: E402
from atroposlib.local.prepare_model import ModelPreparationError, prepare_model  # noqa: E402
from atroposlib.local.signals import stop_signals_raise  # noqa: E402
from atroposlib.local.vllm_service import LocalVLLM, free_port  # noqa: E402
from example_trainer.config import TrainingConfig  # noqa: E402


def prepared_model() -> Path:
    """The bundled model's folder, or an exit naming what is missing (no vLLM runtime yet)."""
    try:
        return prepare_model()
    except (ModelPreparationError, FileNotFoundError) as missing:
        raise SystemExit(f"error: {missing}") from None


STEP_LINE = re.compile(r"^step (\d+) \|.*\| batch score ([-+0-9.]+)")
TIMES = re.compile(r"time wait ([0-9.]+)s \+ train ([0-9.]+)s(?: \+ save ([0-9.]+)s)?(?: \+ sync ([0-9.]+)s)?")
POSITIONS = re.compile(r"training ([0-9]+) positions/s")
STALENESS = re.compile(r"staleness ([0-9.]+) \(max (\d+)\)")
ENV = ROOT / "environments" / "small_sums_env.py"


@dataclass
class Step:
    """One training step as the trainer printed it, with the wall time since training began."""

    step: int
    batch_reward: float
    seconds: float
    step_time: float
    positions_per_s: float
    staleness: Optional[float]
    wait_time: float = 0.0
    save_time: float = 0.0
    sync_time: float = 0.0


@dataclass
class Evaluation:
    """Held-out accuracy of the weights after `step` (0: the starting model)."""

    step: int
    seconds: float
    accuracy: float
    answers: int


@dataclass
class Result:
    cpu: str
    cores: int
    settings: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    evaluations: list[Evaluation] = field(default_factory=list)
    training_seconds: float = 0.0
    evaluation_seconds: float = 0.0
    total_seconds: float = 0.0
    generation_tokens_per_s: float = 0.0
    budget: dict[str, float] = field(default_factory=dict)


def processes(args: argparse.Namespace, model: Path, work: Path) -> dict[str, list[str]]:
    api_port, vllm_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    sequences = args.group_size * args.groups_per_step
    return {
        "run-api": [sys.executable, "-m", "atroposlib.cli.run_api", "--port", str(api_port), "--ephemeral"],
        "atropos-grpo": [
            sys.executable, "-u", "-m", "example_trainer.grpo", "--model-name", str(model),
            "--training-steps", str(args.steps), "--batch-size", str(args.micro_batch),
            "--gradient-accumulation-steps", str(sequences // args.micro_batch), "--seq-len", "256",
            "--max-model-len", "512", "--optimizer", "adamw", "--lr", str(args.lr),
            "--weight-bridge-mode", "reload", "--vllm-restart-interval", str(args.sync_every),
            "--checkpoint-interval", "0", "--save-total-limit", "0", "--vllm-port", str(vllm_port), "--atropos-url", api,
            "--save-path", str(work / "checkpoints"), "--log-dir", str(work), *args.trainer_flag],
        "small_sums_env": [
            sys.executable, str(ENV), "serve", "--env.rollout_server_url", api,
            "--env.group_size", str(args.group_size), "--env.temperature", str(args.temperature),
            "--env.spool_dir", str(work / "spool"), "--env.tokenizer_name", str(model),
            "--env.steps_per_eval", "1000000", *task_flags(args), "--env.seed", str(args.seed),
            "--env.ensure_scores_are_not_same", str(args.all_alike == "drop").lower(), "--openai.server_type", "vllm",
            "--openai.base_url", f"http://127.0.0.1:{vllm_port}/v1", "--openai.model_name", str(model),
            "--openai.tokenizer_name", str(model), "--openai.api_key", "x", *args.env_flag],
    }


def task_flags(args: argparse.Namespace) -> list[str]:
    """The task's settings, the same for training (which pairs are held out) and evaluation."""
    return ["--env.eval_pairs", str(args.eval_pairs), "--env.split_seed", str(args.split_seed),
            "--env.eval_seed", str(args.eval_seed), "--env.max_answer_tokens", str(args.max_answer_tokens)]


def parse_step(line: str, started: float) -> Optional[Step]:
    match = STEP_LINE.match(line)
    if match is None:
        return None
    times, positions, staleness = TIMES.search(line), POSITIONS.search(line), STALENESS.search(line)
    seconds = [float(value) if value else 0.0 for value in times.groups()] if times else [0.0] * 4
    return Step(step=int(match.group(1)), batch_reward=float(match.group(2)), seconds=time.monotonic() - started,
                step_time=seconds[1], positions_per_s=float(positions.group(1)) if positions else 0.0,
                staleness=float(staleness.group(1)) if staleness else None, wait_time=seconds[0],
                save_time=seconds[2], sync_time=seconds[3])


def step_budget(result: Result) -> dict[str, float]:
    """Where the run's wall time went, in seconds: start-up (the processes, the model, vLLM)
    until the first step asked for a batch, then per step waiting for a batch (the generation
    a step could not overlap), training, saving checkpoints and weight syncs, and the evaluation."""
    steps = result.steps
    spent = {"waiting for a batch": sum(s.wait_time for s in steps), "training": sum(s.step_time for s in steps),
             "saving checkpoints": sum(s.save_time for s in steps), "weight sync": sum(s.sync_time for s in steps)}
    first = steps[0] if steps else None
    start_up = first.seconds - (first.wait_time + first.step_time + first.save_time + first.sync_time) if first else 0.0
    other = result.training_seconds - start_up - sum(spent.values())
    return {"start-up": start_up, **spent, "other (logging, acknowledgements, stopping)": other,
            "evaluation": result.evaluation_seconds}


def train(args: argparse.Namespace, model: Path, work: Path) -> tuple[list[Step], float]:
    """Run the three processes until the trainer ends; its steps and the training wall time."""
    running: dict[str, subprocess.Popen[str]] = {}
    steps: list[Step] = []
    started = time.monotonic()
    try:
        for name, command in processes(args, model, work).items():
            # the trainer's lines are read (and echoed) here; the others go to files in `work`
            output = subprocess.PIPE if name == "atropos-grpo" else open(work / f"{name}.log", "w")
            running[name] = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True)
            time.sleep(2 if name == "run-api" else 0)
        trainer = running["atropos-grpo"]
        assert trainer.stdout is not None
        for line in trainer.stdout:
            print(line, end="", flush=True)
            step = parse_step(line, started)
            if step is not None:
                steps.append(step)
        if trainer.wait() != 0:
            raise SystemExit(f"the trainer failed; logs in {work}")
    finally:
        for process in reversed(list(running.values())):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(120)
    return steps, time.monotonic() - started


def evaluate(server: LocalVLLM, model: Path, work: Path, args: argparse.Namespace) -> tuple[float, int]:
    """Held-out accuracy of what `server` serves, and the number of answers it is over."""
    folder = work / f"eval-{len(list(work.glob('eval-*')))}"
    subprocess.run([sys.executable, str(ENV), "evaluate", "--env.data_dir_to_save_evals", str(folder),
                    "--env.tokenizer_name", str(model), "--env.temperature", str(args.temperature),
                    "--env.eval_samples", str(args.eval_samples), "--env.use_wandb", "false", *task_flags(args),
                    "--openai.server_type", "vllm", "--openai.base_url", server.base_url,
                    "--openai.model_name", server.served_name, "--openai.tokenizer_name", str(model),
                    "--openai.api_key", "x"], check=True, stdout=subprocess.DEVNULL)
    metrics = json.loads((folder / "metrics.json").read_text())["results"]["all"]
    return float(metrics["eval/accuracy"]), int(metrics["eval/answers"])


def generation_speed(server: LocalVLLM, args: argparse.Namespace) -> float:
    """vLLM's generation tokens/s on one training step's requests, sent at once, times 4."""
    import openai

    sys.path.insert(0, str(ENV.parent))
    from small_sums_task import messages

    async def one_round() -> tuple[int, float]:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=600)
        started = time.monotonic()
        answers = await asyncio.gather(*(client.chat.completions.create(
            model=server.served_name, messages=messages(i % 10, i // 10 % 10), n=args.group_size,
            max_tokens=args.max_answer_tokens, temperature=args.temperature)
            for i in range(4 * args.groups_per_step)))
        await client.close()
        return sum(answer.usage.completion_tokens for answer in answers), time.monotonic() - started

    tokens, seconds = asyncio.run(one_round())
    return tokens / seconds


def saved_checkpoints(work: Path, eval_every: int, steps: int) -> list[tuple[int, Path]]:
    """The trainer's checkpoints to evaluate: every ``eval_every``-th step's and the final weights."""
    found = sorted((int(path.name.split("_")[1]), path) for path in (work / "checkpoints").glob("step_*")
                   if int(path.name.split("_")[1]) % eval_every == 0)
    if (work / "checkpoints" / "final_model").is_dir():
        found.append((steps, work / "checkpoints" / "final_model"))
    return found


def evaluate_checkpoints(args: argparse.Namespace, model: Path, work: Path, checkpoints: list[tuple[int, Path]],
                         wall: dict[int, float]) -> tuple[list[Evaluation], float]:
    """The starting model and each of `checkpoints` ((step, folder)) on the held-out pairs,
    through one server whose weights are reloaded in place (`wall`: when each step's weights
    were saved); and that server's generation tokens/s on the last weights."""
    results = []
    # vLLM's CPU build kills its engine when a seeded request's prompt is split across steps
    # ("CPU Generator does not use offset"): a token budget above the whole evaluation's prompts keeps them whole
    whole_prompts = ("--max-num-batched-tokens", "16384", "--max-num-seqs", "256")
    with LocalVLLM(model, max_model_len=512, log_path=work / "eval-vllm.log", extra_args=whole_prompts,
                   dtype=args.eval_dtype) as server:
        for step, weights in dict([(0, model), *checkpoints]).items():
            if step:
                server.reload_weights(weights, policy_version=step)
            accuracy, answers = evaluate(server, model, work, args)
            results.append(Evaluation(step, wall.get(step, 0.0), accuracy, answers))
            print(f"held-out accuracy after step {step}: {accuracy:.3f} ({answers} answers)", flush=True)
        speed = generation_speed(server, args)
    return results, speed


def plot(result: Result, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([s.step for s in result.steps], [s.batch_reward for s in result.steps], color="tab:blue", alpha=0.5,
              label="batch reward")
    window = 5
    smooth = [sum(s.batch_reward for s in result.steps[max(0, i - window + 1):i + 1]) / min(window, i + 1)
              for i in range(len(result.steps))]
    left.plot([s.step for s in result.steps], smooth, color="tab:blue", label=f"mean of {window} steps")
    left.set(xlabel="training step", ylabel="mean reward of the batch trained on", title="Training reward")
    left.legend(loc="lower right")
    right.plot([e.seconds / 60 for e in result.evaluations], [e.accuracy for e in result.evaluations], "o-",
               color="tab:green")
    for evaluation in result.evaluations:
        right.annotate(f"step {evaluation.step}", (evaluation.seconds / 60, evaluation.accuracy),
                       textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    right.set(xlabel="training wall time (min)", ylabel="accuracy", ylim=(0, 1),
              title=f"Held-out sums ({result.evaluations[0].answers} answers, T={result.settings['temperature']})")
    figure.suptitle(f"atroposlib GRPO, SmolLM2-135M-Instruct, {precision(result)}, {result.cpu} "
                    f"({result.cores} cores)", fontsize=10)
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=110)


def precision(result: Result) -> str:
    dtype = result.settings["dtype"]
    return f"{dtype} compute, float32 master weights" if dtype != "float32" else "float32"


def summary(result: Result) -> str:
    first, last = result.evaluations[0], result.evaluations[-1]
    positions = [s.positions_per_s for s in result.steps if s.positions_per_s]
    step_times = [s.step_time for s in result.steps if s.step_time]
    return "\n".join([
        f"{result.cpu}, {result.cores} cores; SmolLM2-135M-Instruct, {precision(result)}; {len(result.steps)} steps",
        f"held-out accuracy: {first.accuracy:.3f} before, {last.accuracy:.3f} after ({last.answers} answers each)",
        f"training wall time {result.training_seconds / 60:.1f} min ({result.training_seconds / max(len(result.steps), 1):.1f}"
        f" s per step, of which {sum(step_times) / max(len(step_times), 1):.1f} s in the optimizer step), "
        f"whole run {result.total_seconds / 60:.1f} min",
        "where the time went: " + ", ".join(f"{name} {seconds / 60:.1f} min" for name, seconds in result.budget.items()),
        f"training {sum(positions) / max(len(positions), 1):.0f} positions/s (forward and backward); generation "
        f"(vLLM alone, {4 * result.settings['groups_per_step']} requests of {result.settings['group_size']}) "
        f"{result.generation_tokens_per_s:.0f} tokens/s",
    ])


def dtype_of(args: argparse.Namespace, flags: frozenset[str]) -> str:
    """The dtype the trainer computes in: a ``--trainer-flag=--dtype=...`` or what ``auto`` picks here."""
    for flag in args.trainer_flag:
        if flag.startswith("--dtype="):
            return flag.split("=", 1)[1]
    return TrainingConfig(model_name="m", device="cpu").resolved_dtype(flags).dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="training steps")
    parser.add_argument("--lr", type=float, default=1e-5, help="learning rate")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per group")
    parser.add_argument("--groups-per-step", type=int, default=4, help="groups in each training batch")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward pass")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (training and eval)")
    parser.add_argument("--sync-every", type=int, default=2, help="steps between weight syncs to vLLM")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between evaluated checkpoints")
    parser.add_argument("--eval-samples", type=int, default=8, help="answers per held-out pair")
    parser.add_argument("--eval-pairs", type=int, default=30, help="held-out pairs (a pair and its twin b + a count 2)")
    parser.add_argument("--split-seed", type=int, default=1234, help="which pairs are held out")
    parser.add_argument("--eval-seed", type=int, default=0, help="seeds the evaluation's sampling")
    parser.add_argument("--max-answer-tokens", type=int, default=32, help="longest answer sampled")
    parser.add_argument("--eval-dtype", choices=DTYPES, default="float32",
                        help="the dtype the evaluation's vLLM serves each checkpoint in: float32 (default) "
                             "evaluates the trained float32 weights as they are; bfloat16 (or auto on a CPU with "
                             "bf16 instructions) rounds small updates away")
    parser.add_argument("--seed", type=int, default=0, help="the order in which the environment draws training pairs")
    parser.add_argument("--all-alike", choices=("drop", "keep"), default="drop",
                        help="groups whose answers all score alike: dropped by the environment (its default) or "
                             "trained on (advantage 0, as TRL does)")
    parser.add_argument("--trainer-flag", action="append", default=[],
                        help="extra atropos-grpo flag, e.g. --trainer-flag=--loss-type=dapo (repeatable)")
    parser.add_argument("--env-flag", action="append", default=[],
                        help="extra environment flag, e.g. --env-flag=--env.max_batches_offpolicy=1 (repeatable)")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "images" / "learning_demo.png")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "learning_demo.json")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run's folder (checkpoints, logs) here")
    args = parser.parse_args()
    if args.eval_every % args.sync_every:
        parser.error("--eval-every must be a multiple of --sync-every (checkpoints exist at sync steps)")
    model = prepared_model()
    cpu = read_cpu()
    result = Result(cpu=cpu.model_name, cores=os.cpu_count() or 1,
                    settings={k: v for k, v in vars(args).items() if k not in ("png", "json", "keep")} |
                    {"avx512_bf16": "avx512_bf16" in cpu.flags, "dtype": dtype_of(args, cpu.flags)})
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="learning-demo-"))
    try:
        with stop_signals_raise():
            result.steps, result.training_seconds = train(args, model, work)
            evaluating = time.monotonic()
            checkpoints = saved_checkpoints(work, args.eval_every, len(result.steps))
            result.evaluations, result.generation_tokens_per_s = evaluate_checkpoints(
                args, model, work, checkpoints, {step.step: step.seconds for step in result.steps})
            result.evaluation_seconds = time.monotonic() - evaluating
            result.budget = step_budget(result)
    except KeyboardInterrupt as stop:
        raise SystemExit(f"{stop or 'interrupted'}: every process it started is stopped") from None
    finally:
        if args.keep:
            shutil.copytree(work, args.keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    result.total_seconds = time.monotonic() - started
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(asdict(result), indent=1))
    plot(result, args.png)
    print("\n" + summary(result) + f"\nplot: {args.png}\nfigures: {args.json}")


if __name__ == "__main__":
    main()
