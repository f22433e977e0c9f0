"""How long the local vLLM server takes to answer, with its engine core forked and running the
model itself (atroposlib's ``atropos_engine_fork`` plugin) against vLLM's own CPU start (the
engine core and the model worker each spawned), in one run.

    .venv/bin/python bench/vllm_start.py --rounds 3

Each round starts `atropos-vllm serve`'s server (`LocalVLLM`, the bundled model, float32) once
each way, in turns, so a noisy machine slows both alike: vLLM's own start is the same server with
``VLLM_PLUGINS=""`` (vLLM loads none of its general plugins; the reload extension and the
policy-version middleware are flags, not plugins, and stay). Timed: seconds until /health
answers, then a fixed generation (16 completions of 64 tokens, EOS ignored, twice) as tokens per
second, to show that the fewer processes cost generation nothing. Printed and written to
``docs/results/vllm_start.json`` with the CPU named. Needs the vLLM runtime (`atropos-vllm install`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from atroposlib.local.cpu import BF16_FLAGS, read_cpu  # noqa: E402
from atroposlib.local.prepare_model import prepare_model  # noqa: E402
from atroposlib.local.vllm_service import LocalVLLM  # noqa: E402

SIDES = {"engine core forked, model in it": {}, "vLLM's CPU start (all spawned)": {"VLLM_PLUGINS": ""}}
COMPLETIONS, TOKENS = 16, 64


def one_start(model: Path, environ: dict[str, str]) -> dict[str, float]:
    """Start the server (its log in $ATROPOS_HOME/logs), time its start and a fixed generation, stop it."""
    server = LocalVLLM(model, dtype="float32", environ=environ)
    started = time.monotonic()
    server.start(timeout=900)
    try:
        ready = time.monotonic() - started
        rates = []
        for _ in range(2):
            began = time.monotonic()
            answer = httpx.post(f"{server.base_url}/completions", timeout=600, json={
                "model": server.served_name, "prompt": ["Count: 1 2 3"] * COMPLETIONS, "max_tokens": TOKENS,
                "temperature": 1.0, "ignore_eos": True})
            answer.raise_for_status()
            rates.append(answer.json()["usage"]["completion_tokens"] / (time.monotonic() - began))
    finally:
        server.stop()
    return {"seconds_to_answer": ready, "tokens_per_second": statistics.mean(rates)}


def write_summary(runs: dict[str, list[dict[str, float]]], rounds: int, out: Path, timed: str) -> None:
    """Medians of each side's runs, and the first side's against the second (`timed`, then
    generation), written to `out` as JSON with the CPU named, and printed."""
    cpu = read_cpu()
    bf16 = "with" if cpu.flags.intersection(BF16_FLAGS) else "without"
    summary: dict[str, Any] = {"cpu": f"{cpu.model_name}, {os.cpu_count()} cores, {bf16} bf16 instructions",
                               "rounds": rounds, "sides": {}}
    for side, measured in runs.items():
        summary["sides"][side] = {key: statistics.median(run[key] for run in measured) for key in measured[0]}
        summary["sides"][side]["runs"] = measured
    ours, theirs = summary["sides"].values()
    summary[f"{timed}_ratio"] = ours["seconds_to_answer"] / theirs["seconds_to_answer"]
    summary["generation_ratio"] = ours["tokens_per_second"] / theirs["tokens_per_second"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    for side, medians in summary["sides"].items():
        print(f"{side}: {medians['seconds_to_answer']:.1f} s to answer, {medians['tokens_per_second']:.0f} tokens/s "
              "(medians)")
    print(f"{timed} {summary[f'{timed}_ratio']:.2f}x, generation {summary['generation_ratio']:.2f}x ({summary['cpu']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="Starts of each kind, taking turns.")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "vllm_start.json")
    args = parser.parse_args()
    model = prepare_model()
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for round_ in range(args.rounds):
        for side, environ in SIDES.items():
            runs[side].append(one_start(model, environ))
            print(f"round {round_ + 1}/{args.rounds}, {side}: {runs[side][-1]}", flush=True)
    write_summary(runs, args.rounds, args.out, "start")

if __name__ == "__main__":
    main()
