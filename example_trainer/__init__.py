"""A GRPO trainer that learns from the trajectory API's batches and keeps vLLM's weights current.

    atropos-grpo --model-name HuggingFaceTB/SmolLM2-135M-Instruct --weight-bridge-mode reload

The loop is in `trainers`, the ways new weights reach vLLM in `weight_sync`; the rest are the
parts it is built from: `config` and `cli`, `api` (batches), `data` (batch to tensors),
`training` (loss and optimizer step), `model`, `checkpointing`, `vllm_manager` and the
bundled `vllm_api_server`. Importing `atroposlib` never imports this package (torch stays an
extra).
"""

from example_trainer.cli import config_from_args, parse_args
from example_trainer.config import TrainingConfig
from example_trainer.trainers import train_legacy, train_lora, train_lora_restart, train_shared_vllm

__all__ = [
    "TrainingConfig",
    "train_legacy",
    "train_shared_vllm",
    "train_lora",
    "train_lora_restart",
    "parse_args",
    "config_from_args",
]
