#!/usr/bin/env python3
"""The whole loop on one machine: trajectory API, `DatasetEnv` serving, and the example GRPO trainer.

    python -m environments.dataset_environment.launch_local_dataset_run

Starts ``run-api`` on 127.0.0.1:8000 and waits for it, starts ``dataset_env.py serve`` (its
rollouts come from the vLLM server the trainer starts on port 9001), then runs the example
trainer in this process (`example_trainer.train_legacy`, which launches and restarts vLLM
itself). Both child processes are stopped when training ends, on Ctrl-C and on SIGTERM. Run it
from the repository root with the ``example_trainer`` extra installed; edit the constants below
to change the model, the dataset or the trainer's settings.
"""

from __future__ import annotations

import atexit
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

API_HOST = "127.0.0.1"
API_PORT = 8000
VLLM_HOST = "127.0.0.1"
VLLM_PORT = 9001
MODEL_NAME = "Qwen/Qwen2.5-1.5B-Instruct"
TOKENIZER_NAME = MODEL_NAME
ENV_SCRIPT = Path(__file__).resolve().parent / "dataset_env.py"

TRAINER_CONFIG: dict[str, Any] = {
    "model_name": MODEL_NAME,
    "training_steps": 20,
    "batch_size": 2,
    "gradient_accumulation_steps": 2,
    "seq_len": 512,
    "vllm_port": VLLM_PORT,
    "vllm_restart_interval": 10,
    "use_wandb": False,
    "atropos_url": f"http://{API_HOST}:{API_PORT}",
    "save_path": "./trained_model_checkpoints_local_test",
}

DATASET_FLAGS: List[str] = [
    "--env.group_size", "4",
    "--env.max_num_workers", "2",
    "--env.rollout_server_url", f"http://{API_HOST}:{API_PORT}",
    "--env.tokenizer_name", TOKENIZER_NAME,
    "--env.use_wandb", "false",
    "--env.wandb_name", "dataset_env_local_test",
    "--env.max_token_length", str(TRAINER_CONFIG["seq_len"]),
    "--env.ensure_scores_are_not_same", "true",
    "--env.dataset_name", "HuggingFaceH4/testing_self_instruct_process_essays",
    "--env.dataset_config", "None",
    "--env.split", "train[:100]",
    "--env.prompt_field", "prompt",
    "--env.answer_field", "answer",
    "--env.system_prompt", "None",
    "--env.reward_functions", "repetition_penalty",
    "--env.max_tokens", "128",
    "--env.temperature", "0.7",
    "--env.eval_dataset_name", "None",
    "--openai.model_name", MODEL_NAME,
    "--openai.base_url", f"http://{VLLM_HOST}:{VLLM_PORT}/v1",
    "--openai.api_key", "x",
]

processes: List[subprocess.Popen] = []


def api_command() -> List[str]:
    return [sys.executable, "-m", "atroposlib.cli.run_api", "--host", API_HOST, "--port", str(API_PORT)]


def env_command() -> List[str]:
    return [sys.executable, str(ENV_SCRIPT), "serve", *DATASET_FLAGS]


def trainer_config() -> Any:
    from example_trainer import TrainingConfig

    return TrainingConfig(**TRAINER_CONFIG)


def cleanup_processes() -> None:
    """Stop the children this launcher started, newest first (terminate, then kill after 10 s)."""
    for process in reversed(processes):
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    processes.clear()


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def wait_for_api(timeout_s: float = 60.0) -> None:
    """Block until ``/health`` answers; RuntimeError if the API exits or never answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if processes and processes[0].poll() is not None:
            raise RuntimeError(f"run-api exited with status {processes[0].returncode}")
        try:
            if httpx.get(f"http://{API_HOST}:{API_PORT}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"run-api did not answer on port {API_PORT} within {timeout_s:.0f} s")


def main() -> None:
    from example_trainer import train_legacy

    atexit.register(cleanup_processes)
    signal.signal(signal.SIGINT, _exit_on_signal)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    config = trainer_config()

    print("--- trajectory API:", " ".join(api_command()))
    processes.append(subprocess.Popen(api_command(), cwd=REPO_ROOT))
    wait_for_api()

    print("--- dataset environment:", " ".join(env_command()))
    processes.append(subprocess.Popen(env_command(), cwd=REPO_ROOT))

    print("--- example trainer (GRPO):", config.model_name)
    try:
        train_legacy(config)
    finally:
        cleanup_processes()
    print("--- training complete")


if __name__ == "__main__":
    main()
