"""`atropos-grpo-run`: one command that starts vLLM and trains in ``shared_vllm`` mode.

The mode shares vLLM's weight tensors with the trainer through CUDA IPC, so it needs an
NVIDIA GPU; without one the command exits with status 2 and one line naming the modes that
work here (``reload`` keeps vLLM running and swaps the weights in place).
"""

from __future__ import annotations

from typing import Optional

from example_trainer.cli import create_unified_parser, parse_config
from example_trainer.grpo import run_training


def main(argv: Optional[list[str]] = None) -> None:
    config = parse_config(argv, create_unified_parser()).model_copy(update={"weight_bridge_mode": "shared_vllm"})
    run_training(config, as_command=argv is None)


if __name__ == "__main__":
    main()
