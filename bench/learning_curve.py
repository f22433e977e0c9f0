"""The RL loop learning on a CPU: the brevity environment's score, step by step.

Starts what a user starts in three terminals — `run-api`, `atropos-grpo` (which starts the
bundled vLLM on the model) and ``environments/brevity_env.py serve`` sampling from that
vLLM — trains for ``--steps`` steps, stops everything, and prints the mean score of the
batch each step trained on (shorter answers score higher), a comparison of the first and
last steps, and the wall time. Needs the vLLM runtime (`atropos-vllm install`) and the
prepared model (`atropos-prepare-model`); no GPU, no internet.

    .venv/bin/python bench/learning_curve.py [--steps 20] [--mode reload] [--lr 3e-5]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from atroposlib.local.cpu import read_cpu
from atroposlib.local.prepare_model import prepare_model
from atroposlib.local.signals import stop_signals_raise

ROOT = Path(__file__).resolve().parent.parent
SCORE = re.compile(r"^step (\d+) \|.*\| batch score ([-+0-9.]+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def commands(args: argparse.Namespace, model: Path, work: Path) -> dict[str, list[str]]:
    api_port, vllm_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    return {
        "run-api": [sys.executable, "-m", "atroposlib.cli.run_api", "--port", str(api_port), "--ephemeral"],
        "atropos-grpo": [sys.executable, "-u", "-m", "example_trainer.grpo", "--model-name", str(model),
                         "--training-steps", str(args.steps), "--batch-size", "4", "--gradient-accumulation-steps",
                         str(args.group_size * args.groups_per_step // 4), "--seq-len", "512",
                         "--max-model-len", "1024", "--optimizer", "adamw", "--lr", str(args.lr),
                         "--weight-bridge-mode", args.mode, "--vllm-restart-interval", "1",
                         "--checkpoint-interval", "0", "--keep-last-n", "1", "--vllm-port", str(vllm_port),
                         "--atropos-url", api, "--save-path", str(work / "checkpoints"), "--log-dir", str(work)],
        "brevity_env": [sys.executable, str(ROOT / "environments" / "brevity_env.py"), "serve",
                        "--env.rollout_server_url", api, "--env.group_size", str(args.group_size),
                        "--env.max_token_length", str(args.max_tokens), "--env.spool_dir", str(work / "spool"),
                        "--env.tokenizer_name", str(model), "--openai.server_type", "vllm",
                        "--openai.base_url", f"http://127.0.0.1:{vllm_port}/v1", "--openai.model_name", str(model),
                        "--openai.tokenizer_name", str(model), "--openai.api_key", "x"],
    }


def run(args: argparse.Namespace, model: Path, work: Path) -> list[tuple[int, float]]:
    """Run the three processes until the trainer ends; the (step, batch score) pairs it printed."""
    processes: dict[str, subprocess.Popen[str]] = {}
    scores: list[tuple[int, float]] = []
    try:
        for name, command in commands(args, model, work).items():
            # the trainer's lines are read (and echoed) here; the others go to files in `work`
            output = subprocess.PIPE if name == "atropos-grpo" else open(work / f"{name}.log", "w")
            processes[name] = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True)
            time.sleep(2 if name == "run-api" else 0)
        trainer = processes["atropos-grpo"]
        assert trainer.stdout is not None
        for line in trainer.stdout:
            print(line, end="", flush=True)
            match = SCORE.match(line)
            if match:
                scores.append((int(match.group(1)), float(match.group(2))))
        if trainer.wait() != 0:
            raise SystemExit(f"the trainer failed; logs in {work}")
    finally:
        for process in reversed(list(processes.values())):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(120)
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--mode", default="reload", choices=["reload", "none"], help="weight-bridge mode")
    parser.add_argument("--lr", type=float, default=3e-5, help="learning rate")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per group")
    parser.add_argument("--groups-per-step", type=int, default=2, help="groups in each training batch")
    parser.add_argument("--max-tokens", type=int, default=32, help="longest answer (score 0)")
    args = parser.parse_args()
    model = prepare_model()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, stop_signals_raise():
        scores = run(args, model, Path(tmp))
    minutes = (time.monotonic() - started) / 60
    window = max(1, len(scores) // 4)
    first = sum(score for _, score in scores[:window]) / window
    last = sum(score for _, score in scores[-window:]) / window
    print(f"\n{read_cpu().model_name}, {os.cpu_count()} cores; {model.name}; mode {args.mode}; {minutes:.1f} min")
    print("step  batch score")
    for step, score in scores:
        print(f"{step:4d}  {score:+.3f}  {'#' * round(max(score, 0.0) * 40)}")
    print(f"mean score of the first {window} steps {first:+.3f}, of the last {window} {last:+.3f}")


if __name__ == "__main__":
    main()
