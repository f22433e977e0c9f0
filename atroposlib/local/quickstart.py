"""``atropos-quickstart``: the README's main job, end to end on this machine.

1. install the vLLM runtime (once; CPU build without an NVIDIA GPU);
2. prepare the bundled SmolLM2-135M-Instruct model (once);
3. for ``--task gsm8k`` only: write GSM8K-style problems generated offline (reasoning-gym),
   unless they exist;
4. start vLLM on the model, in the dtype this CPU is fast in;
5. run the task's environment in ``process`` mode against it: real rollouts, scored, written
   to JSONL and rendered to HTML, with a bar of generated tokens (tokens/s, ETA);
6. stop vLLM and print where the files are, a summary (CPU, dtype, tokens/s, how many groups
   carry a learning signal) and the time of every stage.

The default task, ``small_sums`` (``environments/small_sums_env.py``: single-digit sums),
is one the bundled model gets right about 40% of the time, so most groups mix right and
wrong answers: the signal a trainer learns from. ``--task gsm8k`` runs
``environments/gsm8k_server.py`` instead, on which a 135M model scores -1 throughout. The
default job (8 groups of 8 rollouts: 64 sequences generated at once) is sized so that the
first run, runtime install included, takes under 10 minutes on a 2-core CPU without bf16
instructions. SIGINT, SIGTERM and SIGHUP stop it cleanly: the environment process and
vLLM's whole process group are stopped before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Iterator, Optional

from atroposlib.local.cpu import DTYPES, read_cpu
from atroposlib.local.help_format import DefaultsHelpFormatter
from atroposlib.local.prepare_model import ModelPreparationError, prepare_model
from atroposlib.local.runtime import Runtime
from atroposlib.local.signals import stop_signals_raise
from atroposlib.local.token_progress import TokenProgress
from atroposlib.local.vllm_service import LocalVLLM, VLLMStartError

REPO_ROOT = Path(__file__).resolve().parents[2]
PROCESS_STAGE = "run the environment (process mode)"
# process mode's last lines (groups written, groups not written and why) start with this
PROCESS_REPORT_START = "wrote "


@dataclass(frozen=True)
class Task:
    """A job the quickstart can run: its environment file (under ``environments/``), the
    default completion budget of a rollout and the environment flag that sets it, and
    whether it reads GSM8K-style problems that the quickstart writes first."""

    env_file: str
    max_tokens: int
    max_tokens_flag: str
    needs_problems: bool


TASKS: dict[str, Task] = {
    # The answer is a number or two: 32 tokens is the environment's own budget. Every group is
    # written, also those whose answers all score alike, so that the summary counts honestly
    # how many groups carry a signal (the environment's own default drops the others).
    "small_sums": Task("small_sums_env.py", 32, "--env.max_answer_tokens", needs_problems=False),
    "gsm8k": Task("gsm8k_server.py", 128, "--env.max_token_length", needs_problems=True),
}
DEFAULT_TASK = "small_sums"


class QuickstartError(RuntimeError):
    """A stage of the quickstart failed; the message says which and where its log is."""


class Stages:
    """Wall-clock time of each named stage, printed as they finish."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        print(f"==> {name}", flush=True)
        started = time.monotonic()
        yield
        self.seconds[name] = time.monotonic() - started
        print(f"    {name}: {self.seconds[name]:.1f} s", flush=True)


def summarise(jsonl: Path) -> dict[str, float]:
    """Groups, rollouts, mean score and share of correct rollouts in a written JSONL file."""
    groups = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    scores = [score for group in groups for score in group["scores"]]
    return {"groups": len(groups), "rollouts": len(scores), "mean_score": mean(scores) if scores else 0.0,
            "percent_correct": sum(s > 0 for s in scores) / len(scores) if scores else 0.0,
            "groups_with_signal": sum(len(set(group["scores"])) > 1 for group in groups)}


def environment_command(server: LocalVLLM, args: argparse.Namespace, data_dir: Path, out: Path) -> list[str]:
    """The process-mode command line of the task's environment, pointed at `server`."""
    task = TASKS[args.task]
    command = [sys.executable, str(args.env_file), "process", "--env.total_steps", str(args.groups),
               "--env.group_size", str(args.group_size), task.max_tokens_flag, str(args.max_tokens),
               "--env.data_path_to_save_groups", str(out), "--env.use_wandb", "false"]
    if task.needs_problems:
        command += ["--env.train_file", str(data_dir / "train.jsonl"), "--env.test_file", str(data_dir / "test.jsonl")]
    else:
        command += ["--env.ensure_scores_are_not_same", "false"]
    return command + server.openai_flags()


def is_worth_showing(line: str) -> bool:
    """Log lines shown while the job runs (the rest goes to the process-mode log only)."""
    return any(level in line for level in (" WARNING ", " ERROR ", " CRITICAL ", "Traceback"))


def run_environment(server: LocalVLLM, args: argparse.Namespace, data_dir: Path, out: Path,
                    log_path: Path) -> TokenProgress:
    """Run process mode under a bar of generated tokens; its output goes to `log_path`,
    its warnings also to the screen, and its final report under the bar. Stops it if
    interrupted."""
    child_env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    progress = TokenProgress(server.base_url.removesuffix("/v1"), args.groups * args.group_size, args.max_tokens)
    report: list[str] = []
    with open(log_path, "w", encoding="utf-8") as log, progress:
        child = subprocess.Popen(environment_command(server, args, data_dir, out), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=child_env)
        try:
            assert child.stdout is not None
            for line in child.stdout:
                log.write(line)
                if report or line.startswith(PROCESS_REPORT_START):
                    report.append(line.rstrip())
                elif is_worth_showing(line):
                    progress.write("    " + line.rstrip())
            code = child.wait()
        finally:
            _stop(child)
    for line in report:
        print("    " + line)
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise QuickstartError(f"process mode exited with code {code}; last lines of {log_path}:\n{tail}")
    return progress


def _stop(child: subprocess.Popen[str], grace: float = 20.0) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atropos-quickstart", description=__doc__.split("\n\n")[0].replace("``", ""),
                                     formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--task", default=DEFAULT_TASK, metavar="{" + ",".join(TASKS) + "}",
                        help="The job: small_sums (single-digit sums; the bundled model is right about 40%% of "
                             "the time, so most groups carry a learning signal) or gsm8k (GSM8K-style word "
                             "problems generated offline; the bundled model gets none right).")
    parser.add_argument("--groups", type=int, default=8, help="Groups to write.")
    parser.add_argument("--group-size", type=int, default=8, help="Rollouts per group (one prompt, sampled n times).")
    parser.add_argument("--max-tokens", type=int,
                        help="Completion budget per rollout, in tokens (default: the task's: "
                             + ", ".join(f"{task.max_tokens} for {name}" for name, task in TASKS.items()) + ").")
    parser.add_argument("--model", help="Model folder, GGUF file or hub name (default: the bundled SmolLM2).")
    parser.add_argument("--dtype", choices=DTYPES, default="auto",
                        help="vLLM's dtype; auto: bfloat16 on CPUs with avx512_bf16 or amx_bf16, float32 on "
                             "other CPUs, the model's own on a GPU.")
    parser.add_argument("--env-file", type=Path,
                        help="Environment to run instead of the task's own (default: environments/<the task's "
                             "file> of this repository); it takes the flags the task's environment takes.")
    parser.add_argument("--out-dir", type=Path, default=Path("data") / "quickstart",
                        help="Where the JSONL, HTML, logs and generated problems (gsm8k) go.")
    return parser


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    """The command line, with the task's defaults filled in (`--max-tokens`, `--env-file`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.task not in TASKS:
        # one line, like every other failure of the quickstart (argparse's choices would add its usage)
        sys.exit(f"error: unknown task {args.task!r} (--task is one of {', '.join(TASKS)})")
    task = TASKS[args.task]
    if args.max_tokens is None:
        args.max_tokens = task.max_tokens
    if args.env_file is None:
        args.env_file = REPO_ROOT / "environments" / task.env_file
    for flag in ("groups", "group_size", "max_tokens"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    return args


def prepare(runtime: Runtime, args: argparse.Namespace, stages: Stages) -> tuple[Path, Path]:
    """Stages 1-3: the runtime, the model folder and the data folder (GSM8K-style problems,
    written only for a task that reads them)."""
    with stages.stage("install the vLLM runtime"):
        info = runtime.install()
        print(f"    {runtime.path}: {info.device} build, {info.size_bytes / 1e9:.2f} GB "
              f"(installed in {info.install_seconds:.0f} s)")
    with stages.stage("prepare the model"):
        model_dir = prepare_model(args.model, runtime=runtime)
        print(f"    {model_dir}")
    data_dir = args.out_dir / "gsm8k_style"
    if not TASKS[args.task].needs_problems:
        return model_dir, data_dir
    with stages.stage("generate GSM8K-style problems"):
        if not (data_dir / "train.jsonl").exists():
            subprocess.run([sys.executable, str(args.env_file.with_name("gsm8k_offline_data.py")), str(data_dir)],
                           check=True)
    return model_dir, data_dir


def run(args: argparse.Namespace, stages: Stages, out: Path) -> tuple[LocalVLLM, TokenProgress]:
    runtime = Runtime()
    model_dir, data_dir = prepare(runtime, args, stages)
    server = LocalVLLM(model_dir, runtime=runtime, dtype=args.dtype, log_path=out.with_suffix(".vllm.log"))
    with stages.stage("start vLLM"):
        print(f"    CPU: {read_cpu().model_name} ({os.cpu_count()} cores); "
              f"dtype: {server.dtype.dtype} ({server.dtype.reason})")
        print(f"    vLLM log: {server.log_path}", flush=True)
        server.start()
    try:
        with stages.stage(PROCESS_STAGE):
            print(f"    process-mode log: {out.with_suffix('.log')}", flush=True)
            progress = run_environment(server, args, data_dir, out, out.with_suffix(".log"))
    finally:
        with stages.stage("stop vLLM"):
            server.stop()
    return server, progress


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if not args.env_file.exists():
        sys.exit(f"error: no environment file at {args.env_file} (pass --env-file)")
    stages = Stages()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{args.task}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    try:
        with stop_signals_raise():
            server, progress = run(args, stages, out)
    except (QuickstartError, ModelPreparationError, VLLMStartError, subprocess.CalledProcessError,
            FileNotFoundError) as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt as stop:  # vLLM and the environment were stopped on the way out
        sys.exit(f"{stop or 'interrupted'}: stopped vLLM and the environment")
    report(out, stages, server, progress)


def report(out: Path, stages: Stages, server: LocalVLLM, progress: TokenProgress) -> None:
    summary = summarise(out)
    process_seconds = stages.seconds[PROCESS_STAGE]
    print("\nDone.")
    print(f"  rollouts: {out}")
    print(f"  page:     {out.with_suffix('.html')}")
    print(f"  logs:     {out.with_suffix('.log')} (process mode), {server.log_path} (vLLM)")
    print(f"  {summary['groups']} groups, {summary['rollouts']} rollouts, mean score {summary['mean_score']:+.3f}, "
          f"{summary['percent_correct']:.1%} correct, {summary['groups'] / process_seconds * 60:.1f} groups/min")
    print(f"  {summary['groups_with_signal']} of {summary['groups']} groups carry a learning signal (their scores "
          "differ; a trainer learns nothing from a group whose rollouts all score alike)")
    print(f"  {read_cpu().model_name} ({os.cpu_count()} cores), vLLM dtype {server.dtype.dtype}: "
          f"{progress.job.generated_tokens:,.0f} tokens generated in {progress.seconds:.0f} s, "
          f"{progress.tokens_per_second:.1f} tokens/s")
    print("  stage times: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in stages.seconds.items()))


if __name__ == "__main__":
    main()
