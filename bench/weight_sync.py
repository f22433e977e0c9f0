"""One weight update, two ways: restart vLLM on the new checkpoint (``none``, Atropos's legacy
mode) vs read it into the running vLLM (``reload``, this project's extra mode).

Both run in the same process, on the same model and machine, through the trainer's own vLLM
manager: the script starts the bundled vLLM server once, writes checkpoints whose weights
differ, and for each one times ``reload`` (until the new weights are served) and then a
restart (until ``/health`` answers again), as the trainer does after a sync step. It prints
the median of each and their ratio, with the CPU they ran on.

    .venv/bin/python bench/weight_sync.py [--model DIR] [--updates 3] [--port 9001] [--dtype auto]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from atroposlib.local.cpu import read_cpu
from atroposlib.local.prepare_model import prepare_model
from example_trainer.config import TrainingConfig
from example_trainer.vllm_manager import TrainerVLLM


def perturbed_copy(model_dir: Path, out: Path, scale: float) -> Path:
    """A copy of the model whose final norm is scaled: same shapes, different outputs."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    weights = load_file(out / "model.safetensors")
    norm = weights["model.norm.weight"]
    weights["model.norm.weight"] = norm * torch.tensor(scale, dtype=norm.dtype)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled SmolLM2, prepared)")
    parser.add_argument("--updates", type=int, default=3, help="weight updates timed in each mode")
    parser.add_argument("--port", type=int, default=9001, help="port for vLLM")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    args = parser.parse_args()
    model_dir = Path(args.model) if args.model else prepare_model()
    config = TrainingConfig(model_name=str(model_dir), vllm_port=args.port, dtype=args.dtype, max_model_len=1024,
                            device="cpu")
    reload_seconds, restart_seconds = [], []
    with tempfile.TemporaryDirectory() as tmp, TrainerVLLM(config, Path(tmp) / "vllm.log") as vllm:
        first_start = vllm.start(str(model_dir))
        print(f"vLLM started in {first_start:.1f} s ({config.resolved_dtype().dtype})")
        for update in range(args.updates):
            checkpoint = perturbed_copy(model_dir, Path(tmp) / f"step_{update + 1}", 0.5 + 0.1 * update)
            reload_seconds.append(vllm.reload_weights(str(checkpoint), policy_version=update + 1))
            restart_seconds.append(vllm.restart(str(checkpoint), policy_version=update + 1))
            print(f"update {update + 1}: reload {reload_seconds[-1]:.2f} s, restart {restart_seconds[-1]:.1f} s",
                  flush=True)
    reload_median, restart_median = statistics.median(reload_seconds), statistics.median(restart_seconds)
    print(f"\n{read_cpu().model_name}, {os.cpu_count()} cores, {model_dir.name}, {args.updates} updates")
    print(f"  none (restart vLLM): median {restart_median:.1f} s per weight update")
    print(f"  reload (in place):   median {reload_median:.2f} s per weight update")
    print(f"  reload is {restart_median / reload_median:.0f}x faster")


if __name__ == "__main__":
    main()
