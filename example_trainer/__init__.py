"""A GRPO trainer that learns from the trajectory API's batches and keeps vLLM's weights current.

    atropos-grpo --model-name HuggingFaceTB/SmolLM2-135M-Instruct --weight-bridge-mode reload

The loop is in `trainers`, the ways new weights reach vLLM in `weight_sync`; the rest are the
parts it is built from: `config` and `cli`, `api` (batches), `data` (batch to tensors),
`training` (loss and optimizer step), `model`, `checkpointing`, `vllm_manager` and the
bundled `vllm_api_server`. Importing `atroposlib` never imports this package (torch stays an
extra).
"""

from importlib import import_module
from typing import Any

# Where each public name lives. They are imported on first use, so that importing one part
# (the bundled vLLM server runs inside vLLM's own runtime, which has no torch-side
# dependencies of the trainer) does not import the whole trainer.
_EXPORTS = {
    "TrainingConfig": "example_trainer.config",
    "train_legacy": "example_trainer.trainers",
    "train_shared_vllm": "example_trainer.trainers",
    "train_lora": "example_trainer.trainers",
    "train_lora_restart": "example_trainer.trainers",
    "parse_args": "example_trainer.cli",
    "config_from_args": "example_trainer.cli",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'example_trainer' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
