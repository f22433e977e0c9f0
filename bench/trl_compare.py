"""A seeded race on one machine: this project's GRPO trainer against TRL's GRPOTrainer.

Both sides train SmolLM2-135M-Instruct on the learning demo's task (single-digit sums,
``environments/small_sums_task.py``) with the same training pairs, reward, group size, batch,
learning rate, optimizer (AdamW, weight decay 0.01, gradient norm clipped to 1), temperature
and answer length, each in the precision its defaults choose on this CPU (this project:
``--dtype auto``; TRL: ``bf16=True`` autocast over float32 weights, its default, or float32 with
``--trl-precision float32``: on a 2-core CPU without bf16 instructions its default took 440 s for
one step, float32 being what a TRL user there would choose). TRL runs in a
virtual environment of its own (``bench/setup_trl.sh``) with Hugging Face ``generate``, as a TRL
user on a CPU gets it; this project runs the three processes a user runs
(``bench/learning_demo.py``).

The race:

* ``--seeds`` seeds per side, taking turns (seed 0 of every side, then seed 1, ...), so that
  a machine that slows down mid-race slows every side;
* held-out accuracy every ``--eval-every`` steps on pairs never trained on in either order
  (3 + 5 held out means 5 + 3 is too), with seeded sampling, on one vLLM whose weights are
  reloaded in place, for both sides' checkpoints alike;
* groups whose answers all score alike: TRL trains on them (advantage 0); this project runs
  both ways, ``ours-keep`` (the same as TRL) and ``ours-drop`` (its environment's default,
  dynamic sampling as in DAPO), and the two are reported apart;
* this project's environment takes extra flags (``--ours-env-flag``), recorded with its runs:
  the README's race runs it with ``--env.max_batches_offpolicy=1`` (one batch queued, so each
  is sampled by the newest weights);
* per evaluated step, the mean and min–max over seeds of the accuracy and of the wall time;
  the time each side takes to reach TRL's final mean accuracy, and its ratio to TRL's.

Every run's figures go to ``--runs`` as it ends (a stopped race goes on where it stopped;
a stored run with other settings or from another CPU is run again). Timed: run it with the
machine to itself. On a 2-core CPU each run takes 15–25 minutes.

    bash bench/setup_trl.sh .cache/trlvenv
    .venv/bin/python bench/trl_compare.py --trl-python .cache/trlvenv/bin/python --seeds 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
TASK_DIR = ROOT / "environments"
SIDES = ("ours-keep", "trl", "ours-drop")
# settings both sides must share, checked on every stored run
SHARED = ("steps", "lr", "group_size", "groups_per_step", "temperature", "eval_every", "eval_samples",
          "eval_pairs", "split_seed", "eval_seed", "max_answer_tokens", "eval_dtype")


# --- the TRL side: runs in TRL's virtual environment, which has no atroposlib ------------------

def trl_worker(args: argparse.Namespace) -> None:
    """Train with TRL's GRPOTrainer. Writes ``<out>/steps.jsonl`` (one line per step: wall
    seconds since this process began, batch reward), ``<out>/saved.jsonl`` (when each
    checkpoint was written), ``<out>/checkpoint-N`` and ``<out>/precision``."""
    started = time.monotonic()
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
    out.mkdir(parents=True, exist_ok=True)
    config = GRPOConfig(
        output_dir=str(out), max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant",
        weight_decay=0.01, max_grad_norm=1.0, optim="adamw_torch", seed=args.seed,
        per_device_train_batch_size=args.group_size * args.groups_per_step, gradient_accumulation_steps=1,
        num_generations=args.group_size, max_completion_length=args.max_answer_tokens,
        temperature=args.temperature, top_p=1.0, top_k=0, loss_type="grpo", beta=0.0, epsilon=0.2,
        scale_rewards="group", num_iterations=1, shuffle_dataset=False, use_cpu=True,
        logging_steps=1, save_strategy="steps", save_steps=args.eval_every,
        save_only_model=True, report_to="none", disable_tqdm=True,
        **({"bf16": False} if args.trl_precision == "float32" else {}))
    (out / "precision").write_text("bfloat16 autocast, float32 weights" if config.bf16 else "float32")

    def record(name: str, row: dict[str, Any]) -> None:
        with (out / name).open("a") as file:
            file.write(json.dumps({**row, "seconds": time.monotonic() - started}) + "\n")

    class WallClock(TrainerCallback):
        def on_log(self, _args: Any, state: Any, _control: Any, logs: Optional[dict] = None, **_: Any) -> None:
            if logs and "reward" in logs:
                record("steps.jsonl", {"step": state.global_step, "reward": logs["reward"]})
                print(f"TRL step {state.global_step}: reward {logs['reward']:.3f}, "
                      f"{time.monotonic() - started:.0f} s", flush=True)

        def on_save(self, _args: Any, state: Any, _control: Any, **_: Any) -> None:
            record("saved.jsonl", {"step": state.global_step})

    trainer = GRPOTrainer(model=args.model, reward_funcs=reward, args=config, train_dataset=dataset,
                          callbacks=[WallClock()])
    trainer.train()
    (out / "total_seconds").write_text(str(time.monotonic() - started))


# --- the race: runs in this project's virtual environment --------------------------------------

def run_file(runs: Path, side: str, seed: int) -> Path:
    return runs / f"{side}-seed{seed}.json"


def stored_run(path: Path, args: argparse.Namespace, seed: int, cpu: str) -> Optional[dict[str, Any]]:
    """The run stored at `path` if it was made here with these settings and `seed`, else None
    (with the reason printed)."""
    if not path.is_file():
        return None
    run = json.loads(path.read_text())
    wanted = {name: getattr(args, name) for name in SHARED} | {"seed": seed}
    settings = {"eval_dtype": "auto"} | run["settings"]  # runs stored before --eval-dtype were evaluated in auto
    if "trainer_flag" in settings:  # this project's runs: its own knobs must match too
        settings = {"env_flag": []} | settings  # runs stored before environment flags were recorded had none
        wanted |= {"sync_every": args.ours_sync_every, "trainer_flag": args.ours_trainer_flag,
                   "env_flag": args.ours_env_flag}
    elif run.get("side") == "trl":  # runs stored before --trl-precision took TRL's default
        settings = {"trl_precision": "default"} | settings
        wanted |= {"trl_precision": args.trl_precision}
    differing = {name: settings.get(name) for name, value in wanted.items() if settings.get(name) != value}
    if run["cpu"] != cpu or differing:
        print(f"{path.name} was made {'on ' + run['cpu'] if run['cpu'] != cpu else 'with ' + str(differing)}: "
              "running it again", flush=True)
        return None
    return run


def run_ours(args: argparse.Namespace, side: str, seed: int, path: Path) -> None:
    """One run of `bench/learning_demo.py` (the three processes, then the evaluation)."""
    command = [sys.executable, str(ROOT / "bench" / "learning_demo.py"), "--seed", str(seed),
               "--all-alike", side.split("-", 1)[1], "--sync-every", str(args.ours_sync_every),
               "--json", str(path), "--png", str(path.with_suffix(".png")),
               *(f"--{name.replace('_', '-')}={getattr(args, name)}" for name in SHARED),
               *(f"--trainer-flag={flag}" for flag in args.ours_trainer_flag),
               *(f"--env-flag={flag}" for flag in args.ours_env_flag)]
    run_to_end(command)


def run_to_end(command: list[str], env: Optional[dict[str, str]] = None) -> None:
    """Run `command` to its end (`CalledProcessError` if it fails). Stopped (`KeyboardInterrupt`,
    which SIGTERM raises here too), it passes SIGTERM on and waits while the child stops what it
    started: `subprocess.run` would SIGKILL it and leave its servers running."""
    with subprocess.Popen(command, env=env) as child:
        try:
            returncode = child.wait()
        except KeyboardInterrupt:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=180)
            except subprocess.TimeoutExpired:
                child.kill()
            raise
    if returncode:
        raise subprocess.CalledProcessError(returncode, command)


def run_trl(args: argparse.Namespace, seed: int, path: Path, model: Path, cpu: str) -> None:
    """One run of TRL in its own python, then its checkpoints evaluated as this project's are."""
    from bench.learning_demo import evaluate_checkpoints

    work = Path(tempfile.mkdtemp(prefix="trl-race-"))
    try:
        out = work / "trl"
        started = time.monotonic()
        run_to_end([args.trl_python, __file__, "--trl-worker", "--model", str(model), "--out", str(out),
                    f"--seed={seed}", f"--trl-precision={args.trl_precision}",
                    *(f"--{name.replace('_', '-')}={getattr(args, name)}" for name in SHARED)],
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
        training_seconds = time.monotonic() - started
        steps = read_jsonl(out / "steps.jsonl")
        saved = {row["step"]: row["seconds"] for row in read_jsonl(out / "saved.jsonl")}
        precision = (out / "precision").read_text()
        checkpoints = sorted((int(folder.name.split("-")[1]), folder) for folder in out.glob("checkpoint-*"))
        evaluations, _ = evaluate_checkpoints(args, model, work, checkpoints, saved)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    run = {"side": "trl", "cpu": cpu, "cores": os.cpu_count() or 1, "training_seconds": training_seconds,
           "settings": {name: getattr(args, name) for name in SHARED} | {"seed": seed, "all_alike": "keep",
                                                                         "dtype": precision,
                                                                         "trl_precision": args.trl_precision},
           "steps": steps, "evaluations": [vars(evaluation) for evaluation in evaluations]}
    path.write_text(json.dumps(run, indent=1))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def race(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Every side's runs, seed by seed, taking turns; stored runs with these settings are kept."""
    from atroposlib.local.cpu import read_cpu
    from bench.learning_demo import prepared_model

    cpu = read_cpu().model_name
    model = prepared_model()
    args.runs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
    for seed in range(args.seeds):
        for side in args.sides:
            path = run_file(args.runs, side, seed)
            run = stored_run(path, args, seed, cpu)
            if run is None:
                print(f"=== {side}, seed {seed} ===", flush=True)
                if side == "trl":
                    run_trl(args, seed, path, model, cpu)
                else:
                    run_ours(args, side, seed, path)
                run = stored_run(path, args, seed, cpu)
                if run is None:
                    raise SystemExit(f"{path} does not hold the run just made with these settings")
            runs[side].append(run)
    return runs


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def curve(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step evaluated in every run: the mean and min–max of held-out accuracy and wall seconds."""
    by_run = [{e["step"]: e for e in run["evaluations"]} for run in runs]
    steps = sorted(set.intersection(*(set(evaluations) for evaluations in by_run)))
    return [{"step": step, "accuracy": spread([e[step]["accuracy"] for e in by_run]),
             "seconds": spread([e[step]["seconds"] for e in by_run])} for step in steps]


def reach_time(points: list[tuple[float, float]], target: float) -> Optional[float]:
    """The first wall time at which `points` ((seconds, accuracy)) reach `target`, interpolated
    linearly between evaluated checkpoints; None when they never do."""
    if points and points[0][1] >= target:
        return points[0][0]
    for (t0, a0), (t1, a1) in zip(points, points[1:]):
        if a1 >= target:
            return t0 + (t1 - t0) * (target - a0) / (a1 - a0)
    return None


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The race's figures: per side its curve, precision, training time and time to TRL's
    final mean accuracy (on the mean curve, and per seed), and at each step whether it is
    behind TRL beyond the seeds' spread."""
    first = next(iter(runs.values()))[0]
    sides = {side: {"dtype": precision(side_runs[0]), "seeds": len(side_runs),
                    "training_seconds": spread([run["training_seconds"] for run in side_runs]),
                    "curve": curve(side_runs)} for side, side_runs in runs.items()}
    result: dict[str, Any] = {"cpu": first["cpu"], "cores": first["cores"],
                              "settings": {name: getattr(args, name) for name in SHARED} | {
                                  "ours_sync_every": args.ours_sync_every,
                                  "ours_trainer_flags": args.ours_trainer_flag,
                                  "ours_env_flags": args.ours_env_flag},
                              "sides": sides}
    if "trl" not in sides:
        return result
    target = sides["trl"]["curve"][-1]["accuracy"]["mean"]
    result["target"] = target
    trl_at = reach_time(mean_points(sides["trl"]["curve"]), target)
    trl_by_step = {point["step"]: point["accuracy"] for point in sides["trl"]["curve"]}
    for name, side in sides.items():
        side["reach_seconds"] = reach_time(mean_points(side["curve"]), target)
        side["reach_seconds_per_seed"] = [reach_time([(e["seconds"], e["accuracy"]) for e in run["evaluations"]],
                                                     target) for run in runs[name]]
        side["ratio_to_trl"] = (side["reach_seconds"] / trl_at if side["reach_seconds"] is not None and trl_at
                                else None)
        # with one seed a side there is no spread to speak of: the check needs two or more
        side["behind_trl_beyond_spread"] = [
            point["step"] for point in side["curve"] if min(side["seeds"], sides["trl"]["seeds"]) > 1
            and point["step"] in trl_by_step and point["accuracy"]["max"] < trl_by_step[point["step"]]["min"]]
    return result


def precision(run: dict[str, Any]) -> str:
    """How a run held and computed its weights, in words."""
    dtype = run["settings"].get("dtype") or "?"
    if run.get("side") == "trl" or dtype == "float32":  # TRL's worker words its own
        return dtype
    return f"{dtype} compute, float32 masters"


def mean_points(points: list[dict[str, Any]]) -> list[tuple[float, float]]:
    return [(point["seconds"]["mean"], point["accuracy"]["mean"]) for point in points]


LABELS = {"trl": "TRL GRPOTrainer", "ours-keep": "atroposlib, all-alike groups kept",
          "ours-drop": "atroposlib, all-alike groups dropped"}
COLOURS = {"trl": "tab:orange", "ours-keep": "tab:blue", "ours-drop": "tab:green"}


def plot(result: dict[str, Any], runs: dict[str, list[dict[str, Any]]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for side, figures in result["sides"].items():
        colour = COLOURS.get(side, "tab:gray")
        for run in runs[side]:
            axes.plot([e["seconds"] / 60 for e in run["evaluations"]], [e["accuracy"] for e in run["evaluations"]],
                      color=colour, alpha=0.25, linewidth=0.8)
        minutes = [point["seconds"]["mean"] / 60 for point in figures["curve"]]
        axes.fill_between(minutes, [point["accuracy"]["min"] for point in figures["curve"]],
                          [point["accuracy"]["max"] for point in figures["curve"]], color=colour, alpha=0.15)
        axes.plot(minutes, [point["accuracy"]["mean"] for point in figures["curve"]], "o-", color=colour,
                  label=f"{LABELS.get(side, side)} ({figures['dtype']}; mean of {figures['seeds']}, min–max)")
    if "target" in result:
        axes.axhline(result["target"], color="gray", linestyle="--", linewidth=0.8,
                     label=f"TRL's final mean accuracy {result['target']:.3f}")
    settings = result["settings"]
    axes.set(xlabel="wall time since launch (min)", ylabel="held-out accuracy", ylim=(0, 1),
             title=f"GRPO on held-out sums, SmolLM2-135M-Instruct, {settings['steps']} steps of "
                   f"{settings['groups_per_step']}x{settings['group_size']}; {result['cpu']} ({result['cores']} cores)")
    axes.title.set_fontsize(9)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=110)


def summary(result: dict[str, Any]) -> str:
    lines = [f"{result['cpu']}, {result['cores']} cores; {result['settings']['steps']} steps of "
             f"{result['settings']['groups_per_step']} groups of {result['settings']['group_size']}"]
    for side, figures in result["sides"].items():
        accuracy = " -> ".join(f"{p['accuracy']['mean']:.3f} [{p['accuracy']['min']:.3f}-{p['accuracy']['max']:.3f}] "
                               f"at {p['seconds']['mean'] / 60:.1f} min (step {p['step']})" for p in figures["curve"])
        lines.append(f"{LABELS.get(side, side)} ({figures['dtype']}, {figures['seeds']} seeds): training "
                     f"{figures['training_seconds']['mean'] / 60:.1f} min; held-out {accuracy}")
    if "target" in result:
        for side, figures in result["sides"].items():
            reach = figures["reach_seconds"]
            lines.append(f"{LABELS.get(side, side)}: TRL's final mean accuracy {result['target']:.3f} "
                         + (f"reached after {reach / 60:.1f} min ({figures['ratio_to_trl']:.2f}x TRL's time)"
                            if reach is not None and figures["ratio_to_trl"] is not None else "not reached")
                         + (f"; behind TRL beyond the seeds' spread at steps {figures['behind_trl_beyond_spread']}"
                            if figures["behind_trl_beyond_spread"] else ""))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trl-python", default=str(ROOT / ".cache" / "trlvenv" / "bin" / "python"),
                        help="python of the TRL environment (bench/setup_trl.sh)")
    parser.add_argument("--seeds", type=int, default=3, help="runs per side (seeds 0, 1, ...)")
    parser.add_argument("--sides", type=lambda text: text.split(","), default=list(SIDES),
                        help=f"comma-separated, in turn order, from {','.join(SIDES)}")
    parser.add_argument("--runs", type=Path, default=ROOT / ".cache" / "trl-race",
                        help="where each run's figures are kept (a stopped race goes on from there)")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "trl_compare.json")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "images" / "trl_compare.png")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--eval-pairs", type=int, default=30)
    parser.add_argument("--split-seed", type=int, default=1234)
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--max-answer-tokens", type=int, default=32)
    parser.add_argument("--eval-dtype", choices=("auto", "float32", "bfloat16"), default="float32",
                        help="the dtype both sides' checkpoints are evaluated in (see bench/learning_demo.py)")
    parser.add_argument("--ours-sync-every", type=int, default=1, help="this project's steps between weight syncs")
    parser.add_argument("--ours-trainer-flag", action="append", default=[],
                        help="an extra atropos-grpo flag for this project's runs (repeatable)")
    parser.add_argument("--ours-env-flag", action="append", default=[],
                        help="an extra flag of this project's environment (repeatable), e.g. "
                             "--ours-env-flag=--env.max_batches_offpolicy=1")
    parser.add_argument("--trl-precision", choices=("default", "float32"), default="default",
                        help="TRL's precision: its default (bf16=True, autocast over float32 weights), or float32 "
                             "(bf16=False), for CPUs without bf16 instructions, where its default is very slow")
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args)
        return
    unknown = set(args.sides) - set(SIDES)
    if unknown:
        parser.error(f"--sides: unknown {', '.join(sorted(unknown))} (choose from {', '.join(SIDES)})")
    if args.eval_every % args.ours_sync_every:
        parser.error("--eval-every must be a multiple of --ours-sync-every (checkpoints exist at sync steps)")
    sys.path.insert(0, str(ROOT))
    from atroposlib.local.signals import stop_signals_raise

    try:
        with stop_signals_raise():
            runs = race(args)
    except KeyboardInterrupt as stop:
        raise SystemExit(f"{stop or 'interrupted'}: the run under way is stopped; "
                         f"finished runs are kept in {args.runs}")
    result = report(args, runs)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    plot(result, runs, args.png)
    print("\n" + summary(result) + f"\nplot: {args.png}\nfigures: {args.json}")


if __name__ == "__main__":
    main()
