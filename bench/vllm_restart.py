"""How long the trainer's vLLM takes to come back when it is restarted on new weights
(``--weight-bridge-mode none``, the default, and ``lora_restart``): forked from the fork
server, which imported vLLM once (`atroposlib.local.forkserver`), against a fresh process, as
Atropos's trainer starts each one, in one run.

    .venv/bin/python bench/vllm_restart.py --rounds 3

Both sides are the trainer's own launcher (`TrainerVLLM`) and bundled server on the bundled
model in float32; the fresh side is a launcher of a mode that starts its server once (``reload``),
which starts every server as a new process. Each side starts once untimed (the fork server's
import happens there), then the sides take turns, so a noisy machine slows both alike: timed are
the seconds from launch until the server answers, then a fixed generation (16 completions of 64
tokens, EOS ignored) as tokens per second, to show that a forked server generates as fast.
Printed and written to ``docs/results/vllm_restart.json`` with the CPU named. Needs the vLLM
runtime (`atropos-vllm install`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from atroposlib.local.prepare_model import prepare_model  # noqa: E402
from atroposlib.local.vllm_service import free_port  # noqa: E402
from bench.vllm_start import write_summary  # noqa: E402
from example_trainer.config import TrainingConfig  # noqa: E402
from example_trainer.vllm_manager import TrainerVLLM  # noqa: E402

SIDES = {"forked from the fork server": "none", "a fresh process (as Atropos restarts it)": "reload"}
COMPLETIONS, TOKENS = 16, 64


def generation_speed(manager: TrainerVLLM) -> float:
    began = time.monotonic()
    answer = httpx.post(f"{manager.base_url}/completions", timeout=600, json={
        "model": manager.config.model_name, "prompt": "Count: 1 2 3", "n": COMPLETIONS, "max_tokens": TOKENS,
        "temperature": 1.0, "ignore_eos": True})
    answer.raise_for_status()
    return answer.json()["usage"]["completion_tokens"] / (time.monotonic() - began)


def one_start(manager: TrainerVLLM, model: str) -> dict[str, float]:
    """Start the side's server (timed until it answers), time a fixed generation, stop it."""
    try:
        seconds = manager.start(model, timeout=900)
        return {"seconds_to_answer": seconds, "tokens_per_second": generation_speed(manager)}
    finally:
        manager.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="Timed restarts of each kind, taking turns.")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "vllm_restart.json")
    args = parser.parse_args()
    model = str(prepare_model())
    logs = Path(tempfile.mkdtemp(prefix="vllm-restart-"))
    managers = {side: TrainerVLLM(TrainingConfig(model_name=model, dtype="float32", vllm_dtype="float32",
                                                 weight_bridge_mode=mode, vllm_port=free_port(),
                                                 max_model_len=2048), logs / f"{mode}.log")
                for side, mode in SIDES.items()}
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    try:
        for side, manager in managers.items():
            first = one_start(manager, model)
            print(f"first start, {side}: {first['seconds_to_answer']:.1f} s (untimed)", flush=True)
        for round_ in range(args.rounds):
            for side, manager in managers.items():
                runs[side].append(one_start(manager, model))
                print(f"round {round_ + 1}/{args.rounds}, {side}: {runs[side][-1]}", flush=True)
    finally:
        for manager in managers.values():
            manager.close()
    write_summary(runs, args.rounds, args.out, "restart")

if __name__ == "__main__":
    main()
