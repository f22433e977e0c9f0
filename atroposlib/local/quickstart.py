"""``atropos-quickstart``: the README's main job, end to end on this machine.

1. install the vLLM runtime (once; CPU build without an NVIDIA GPU);
2. prepare the bundled SmolLM2-135M-Instruct model (once);
3. write GSM8K-style problems generated offline (reasoning-gym), unless they exist;
4. start vLLM on the model;
5. run ``environments/gsm8k_server.py process`` against it: real rollouts, scored, written
   to JSONL and rendered to HTML;
6. stop vLLM and print where the files are, a summary and the time of every stage.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from statistics import mean
from typing import Iterator, Optional

from atroposlib.local.prepare_model import ModelPreparationError, prepare_model
from atroposlib.local.runtime import Runtime
from atroposlib.local.vllm_service import LocalVLLM, VLLMStartError

REPO_ROOT = Path(__file__).resolve().parents[2]


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
            "percent_correct": sum(s > 0 for s in scores) / len(scores) if scores else 0.0}


def run_environment(server: LocalVLLM, env_file: Path, data_dir: Path, out: Path, groups: int,
                    group_size: int, max_tokens: int) -> None:
    command = [sys.executable, str(env_file), "process", "--env.total_steps", str(groups),
               "--env.group_size", str(group_size), "--env.max_token_length", str(max_tokens),
               "--env.train_file", str(data_dir / "train.jsonl"), "--env.test_file", str(data_dir / "test.jsonl"),
               "--env.data_path_to_save_groups", str(out), "--env.use_wandb", "false", *server.openai_flags()]
    subprocess.run(command, check=True)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="atropos-quickstart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=16, help="Groups to write.")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256, help="Completion budget per rollout.")
    parser.add_argument("--model", help="Model folder, GGUF file or hub name (default: bundled SmolLM2).")
    parser.add_argument("--env-file", type=Path, default=REPO_ROOT / "environments" / "gsm8k_server.py")
    parser.add_argument("--out-dir", type=Path, default=Path("data") / "quickstart")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if not args.env_file.exists():
        sys.exit(f"error: no environment file at {args.env_file} (pass --env-file)")
    stages, runtime = Stages(), Runtime()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"gsm8k-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    try:
        with stages.stage("install the vLLM runtime"):
            info = runtime.install()
            print(f"    {runtime.path}: {info.device} build, {info.size_bytes / 1e9:.2f} GB "
                  f"(installed in {info.install_seconds:.0f} s)")
        with stages.stage("prepare the model"):
            model_dir = prepare_model(args.model, runtime=runtime)
            print(f"    {model_dir}")
        data_dir = args.out_dir / "gsm8k_style"
        with stages.stage("generate GSM8K-style problems"):
            if not (data_dir / "train.jsonl").exists():
                subprocess.run([sys.executable, str(args.env_file.with_name("gsm8k_offline_data.py")), str(data_dir)],
                               check=True)
        server = LocalVLLM(model_dir, runtime=runtime)
        with stages.stage("start vLLM"):
            server.start()
        try:
            with stages.stage("run the environment (process mode)"):
                run_environment(server, args.env_file, data_dir, out, args.groups, args.group_size, args.max_tokens)
        finally:
            with stages.stage("stop vLLM"):
                server.stop()
    except (ModelPreparationError, VLLMStartError, subprocess.CalledProcessError, FileNotFoundError) as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:  # a vLLM it started was stopped by the finally block above
        sys.exit("interrupted")
    report(out, stages)


def report(out: Path, stages: Stages) -> None:
    summary = summarise(out)
    process_seconds = stages.seconds["run the environment (process mode)"]
    print("\nDone.")
    print(f"  rollouts: {out}")
    print(f"  page:     {out.with_suffix('.html')}")
    print(f"  {summary['groups']} groups, {summary['rollouts']} rollouts, mean score {summary['mean_score']:+.3f}, "
          f"{summary['percent_correct']:.1%} correct, {summary['groups'] / process_seconds * 60:.1f} groups/min")
    print("  stage times: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in stages.seconds.items()))


if __name__ == "__main__":
    main()
