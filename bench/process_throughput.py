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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
ENV_FILE = ROOT / "environments" / "arithmetic_env.py"
DEFAULT_REFERENCE_PYTHON = os.environ.get("ATROPOS_REFERENCE_PYTHON", "/opt/refvenv/bin/python")


def run(python: str, workdir: Path, out: Path, groups: int, tokenizer: Path, inference: str,
        extra: list[str]) -> tuple[float, float]:
    """Wall seconds of one `process` run, and seconds from its launch to its first inference request."""
    server_root = inference.removesuffix("/v1")
    httpx.post(server_root + "/stats/reset", timeout=10).raise_for_status()
    command = [python, str(ENV_FILE), "process", "--env.total_steps", str(groups),
               "--env.tokenizer_name", str(tokenizer), "--openai.base_url", inference,
               "--openai.model_name", "fake-model", "--env.use_wandb", "false",
               "--env.data_path_to_save_groups", str(out), *extra]
    launched_at, started = time.time(), time.perf_counter()
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True,
                            env={**os.environ, "WANDB_MODE": "disabled"}, timeout=3600)
    elapsed = time.perf_counter() - started
    first_request_at = httpx.get(server_root + "/stats", timeout=10).json()["first_post_at"]
    if result.returncode != 0:
        raise SystemExit(f"{python} failed:\n{result.stderr[-3000:]}")
    written = len(out.read_text().splitlines())
    if written != groups:
        raise SystemExit(f"{python} wrote {written} groups, expected {groups}")
    return elapsed, first_request_at - launched_at


def serve_startup(python: str, workdir: Path, tokenizer: Path, inference: str) -> float:
    """Seconds from launching ``serve`` (against a fresh run-api whose trainer is registered) to
    its first inference request; the environment is then stopped with SIGTERM (a SIGINT would be
    ignored when the benchmark itself runs in the background). Each launch gets
    its own API: groups an earlier one queued would make the next hold back its requests."""
    from tests.helpers import ApiProcess  # main() has put the repository on the path

    with ApiProcess(None, "--ephemeral", "--log-level", "warning") as api:
        httpx.post(api.url + "/register", timeout=10, json={
            "wandb_group": "bench", "wandb_project": "bench", "batch_size": 64, "max_token_len": 2048,
            "checkpoint_dir": "ckpt", "save_checkpoint_interval": 100, "starting_step": 0, "num_steps": 1000,
        }).raise_for_status()
        httpx.get(api.url + "/batch", timeout=10).raise_for_status()  # the trainer has started
        return _first_request_after_launch(python, workdir, tokenizer, inference, api.url)


def _first_request_after_launch(python: str, workdir: Path, tokenizer: Path, inference: str, api_url: str) -> float:
    server_root = inference.removesuffix("/v1")
    httpx.post(server_root + "/stats/reset", timeout=10).raise_for_status()
    command = [python, str(ENV_FILE), "serve", "--env.rollout_server_url", api_url,
               "--env.tokenizer_name", str(tokenizer), "--openai.base_url", inference,
               "--openai.model_name", "fake-model", "--env.use_wandb", "false", "--env.total_steps", "100000",
               # atroposlib 0.4.0's serve registers a null name without it, which its own API refuses
               "--env.wandb_name", "arithmetic"]
    launched_at = time.time()
    process = subprocess.Popen(command, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "WANDB_MODE": "disabled"})
    try:
        deadline = launched_at + 120
        while time.time() < deadline and process.poll() is None:
            first_request_at = httpx.get(server_root + "/stats", timeout=10).json()["first_post_at"]
            if first_request_at is not None:
                return first_request_at - launched_at
            time.sleep(0.02)
        process.kill()
        raise SystemExit(f"{python} serve sent no inference request:\n{process.communicate(timeout=30)[1][-3000:]!r}")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the test server takes per request")
    parser.add_argument("--reference-python", default=DEFAULT_REFERENCE_PYTHON)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, taking turns; medians are shown")
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
        # One uncounted group each first: both then start with warm disk caches, and this
        # project with its tokenizer class remembered (atroposlib/envs/tokenizer_class_memo.py),
        # as on every start after a tokenizer's first.
        for python in (args.reference_python, sys.executable):
            run(python, workdir, workdir / "warm-up.jsonl", 1, tokenizer, inference, [])
            (workdir / "warm-up.jsonl").unlink()
        runs: dict[str, list[tuple[float, float]]] = {"reference": [], "ours": [], "wide": []}
        for turn in range(args.repeats):
            runs["reference"].append(run(args.reference_python, workdir, workdir / f"reference-{turn}.jsonl",
                                         args.groups, tokenizer, inference, []))
            runs["ours"].append(run(sys.executable, workdir, workdir / f"ours-{turn}.jsonl", args.groups, tokenizer,
                                    inference, []))
            runs["wide"].append(run(sys.executable, workdir, workdir / f"ours-32-{turn}.jsonl", args.groups,
                                    tokenizer, inference, ["--env.process_concurrency", "32"]))
        reference, ours, wide = (tuple(statistics.median(column) for column in zip(*runs[name]))
                                 for name in ("reference", "ours", "wide"))
        serve_starts = {python: [serve_startup(python, workdir, tokenizer, inference) for _ in range(args.repeats)]
                        for python in (args.reference_python, sys.executable)}
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{args.groups} groups of 4, test server latency {args.latency} s per request, "
          f"median of {args.repeats} runs each")
    print(f"{'':<18}{'seconds':>10}{'groups/min':>12}{'first request':>15}")
    rows = [("atroposlib 0.4.0", reference, ""), ("this project", ours, "(default: 8 groups at once)"),
            ("  concurrency 32", wide, "(--env.process_concurrency 32)")]
    for name, (seconds, startup), remark in rows:
        print(f"{name:<18}{seconds:>10.1f}{args.groups / seconds * 60:>12.1f}{startup:>13.2f} s   {remark}")
    print(f"speed-up: {reference[0] / ours[0]:.1f}x with defaults, {reference[0] / wide[0]:.1f}x with 32 at once "
          "(all runs include start-up: imports, tokenizer, HTML report); "
          f"first request {reference[1] / ours[1]:.1f}x sooner")
    serve_reference, serve_ours = (statistics.median(serve_starts[p]) for p in (args.reference_python, sys.executable))
    print(f"serve, launch to first inference request (median): atroposlib 0.4.0 {serve_reference:.2f} s, "
          f"this project {serve_ours:.2f} s")

if __name__ == "__main__":
    main()
