"""Atropos's shared-weights patches for vLLM, which this project does not provide.

Atropos's ``shared_vllm`` weight bridge patches vLLM's GPU model runner so the trainer can
map vLLM's weight tensors through CUDA IPC and train them in place. That needs NVIDIA GPUs
and vLLM's CUDA build; this package keeps the names so imports of them fail with that
reason instead of an ImportError, and patches nothing. Without shared weights, the
``reload`` weight bridge swaps new weights into a running vLLM instead.
"""

from __future__ import annotations

from typing import NoReturn

__all__ = ["CUDA_REQUIRED", "SharedWeightsUnavailable", "apply_patches", "get_patched_runner", "is_patched"]

CUDA_REQUIRED = ("shared_vllm (weights shared with vLLM through CUDA IPC) needs NVIDIA GPUs and a patched "
                 "CUDA build of vLLM, which this project does not provide: use --weight-bridge-mode reload, "
                 "none, lora_only or lora_restart")


class SharedWeightsUnavailable(RuntimeError):
    """Shared-weights mode was asked for; it cannot run here."""


def is_patched() -> bool:
    """Whether vLLM runs with shared-weights patches: never, with this package."""
    return False


def apply_patches() -> NoReturn:
    raise SharedWeightsUnavailable(CUDA_REQUIRED)


def get_patched_runner() -> NoReturn:
    raise SharedWeightsUnavailable(CUDA_REQUIRED)
