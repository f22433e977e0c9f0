"""`process` mode throughput: this project vs atroposlib 0.4.0 on the same environment file.

Both run ``environments/arithmetic_env.py process`` for the same number of groups
against one OpenAI-compatible test server that answers every request after a fixed
delay (like a real server's generation time), and the script prints the wall times and
their ratio. Atropos generates one group at a time; this project runs up to
``process_concurrency`` (default: max_num_workers) at once.

    python bench/process_throughput.py [--groups 64] [--latency 0.5]
        [--reference-python /opt/refvenv/bin/python]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV_FILE = ROOT / "environments" / "arithmetic_env.py"
DEFAULT_REFERENCE_PYTHON = os.environ.get("ATROPOS_REFERENCE_PYTHON", "/opt/refvenv/bin/python")


def run(python: str, workdir: Path, out: Path, groups: int, tokenizer: Path, inference: str, extra: list[str]) -> float:
    command = [python, str(ENV_FILE), "process", "--env.total_steps", str(groups),
               "--env.tokenizer_name", str(tokenizer), "--openai.base_url", inference,
               "--openai.model_name", "fake-model", "--env.use_wandb", "false",
               "--env.data_path_to_save_groups", str(out), *extra]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True,
                            env={**os.environ, "WANDB_MODE": "disabled"}, timeout=3600)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{python} failed:\n{result.stderr[-3000:]}")
    written = len(out.read_text().splitlines())
    if written != groups:
        raise SystemExit(f"{python} wrote {written} groups, expected {groups}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the test server takes per request")
    parser.add_argument("--reference-python", default=DEFAULT_REFERENCE_PYTHON)
    args = parser.parse_args()
    args.reference_python = os.path.abspath(args.reference_python)  # the runs' working folder is elsewhere
    if not Path(args.reference_python).exists():
        raise SystemExit(f"no reference interpreter at {args.reference_python}: run bench/setup_reference.sh")
    sys.path.insert(0, str(ROOT))
    from tests.envs.conftest import start_fake_inference
    from tests.tokenizer_fixture import build_tokenizer

    workdir = Path(tempfile.mkdtemp(prefix="atropos-process-bench-"))
    tokenizer = build_tokenizer(workdir / "tokenizer")
    server, inference = start_fake_inference(args.latency)
    try:
        reference = run(args.reference_python, workdir, workdir / "reference.jsonl", args.groups, tokenizer, inference, [])
        ours = run(sys.executable, workdir, workdir / "ours.jsonl", args.groups, tokenizer, inference, [])
        wide = run(sys.executable, workdir, workdir / "ours-32.jsonl", args.groups, tokenizer, inference,
                   ["--env.process_concurrency", "32"])
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{args.groups} groups of 4, test server latency {args.latency} s per request")
    print(f"{'':<18}{'seconds':>10}{'groups/min':>12}")
    print(f"{'atroposlib 0.4.0':<18}{reference:>10.1f}{args.groups / reference * 60:>12.1f}")
    print(f"{'this project':<18}{ours:>10.1f}{args.groups / ours * 60:>12.1f}   (default: 8 groups at once)")
    print(f"{'  concurrency 32':<18}{wide:>10.1f}{args.groups / wide * 60:>12.1f}   (--env.process_concurrency 32)")
    print(f"speed-up: {reference / ours:.1f}x with defaults, {reference / wide:.1f}x with 32 at once "
          "(all runs include start-up: imports, tokenizer, HTML report)")


if __name__ == "__main__":
    main()
