"""Mixed precision: float32 master weights and optimizer state, arithmetic in the compute dtype.

Why: AdamW moves a weight by about the learning rate each step (1e-5 here), while bfloat16
keeps 8 significant bits: the spacing of bfloat16 numbers near a typical weight of 0.02 is
7.8e-5, so a bfloat16 weight stepped in place rounds almost every update back to where it
was. The trainer therefore keeps every trainable weight, its gradient and the optimizer's
moments in float32 (the *master* copy) and runs the forward and backward passes in the
*compute* dtype the device is fast in (``--dtype``, bfloat16 on GPUs and on CPUs with bf16
instructions), as TRL (Hugging Face Trainer) and verl do:

* one process and DDP: ``torch.autocast`` around each forward pass; matrix multiplies run in
  bfloat16 on bfloat16 copies of the weights, made once per step and shared by its
  micro-batches, and gradients arrive in float32;
* FSDP2: its own policy (``MixedPrecisionPolicy``): float32 shards, gathered in bfloat16
  for compute, gradients reduced in float32;
* LoRA: the frozen base model is loaded in the compute dtype (it never changes, so nothing
  is lost and half the memory is saved); the adapters, the only trained weights, are float32
  (PEFT's default for a low-precision base) and run under autocast;
* the frozen reference model of ``--kl-reference model`` is loaded in the compute dtype;
* float16 compute also scales the loss (``torch.amp.GradScaler``), as float16 gradients
  underflow without it.

Checkpoints carry the float32 master weights, so a resumed run continues exactly; vLLM casts
them to its own dtype when it loads them. ``--dtype float32`` computes in float32 too. There
is no pure-bfloat16 mode: its optimizer would need stochastic rounding or Kahan summation to
keep small updates, and the memory it saves is not worth a run that silently stops learning.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Optional

import torch

from example_trainer.config import TrainingConfig

MASTER_DTYPE = torch.float32
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# float16's loss scale starts here and halves on every overflow (GradScaler's default 2**16
# would skip the first steps of a run that has few).
FLOAT16_INITIAL_SCALE = 2.0 ** 10


def dtype_name(dtype: torch.dtype) -> str:
    """``bfloat16`` for ``torch.bfloat16``."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Precision:
    """The dtypes of one run: `compute` for the forward and backward passes, `master` for the
    trained weights and the optimizer's state; `sharded` when FSDP2 does the casting."""

    compute: torch.dtype
    master: torch.dtype = MASTER_DTYPE
    device_type: str = "cpu"
    sharded: bool = False

    @property
    def mixed(self) -> bool:
        """Whether compute runs in a lower precision than the master weights."""
        return self.compute != self.master

    def autocast(self) -> AbstractContextManager[Any]:
        """The context a forward pass runs in: autocast to the compute dtype, unless compute
        is float32 or FSDP2 already gathers the weights in it."""
        if not self.mixed or self.sharded:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.compute)

    def casts_kept(self) -> AbstractContextManager[Any]:
        """The context all of a step's passes run in: the weights' casts to the compute dtype
        that autocast makes in the first forward are reused by the step's other micro-batches
        (autocast keeps them until its outermost context ends) instead of being made again in
        each; itself autocast turned off, so backward passes still run outside autocast. The
        optimizer step must come after it: the kept casts are of the weights before the step."""
        if not self.mixed or self.sharded:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.compute, enabled=False)

    def grad_scaler(self) -> Optional[torch.amp.GradScaler]:
        """A loss scaler for float16 compute (its gradients underflow without one); None otherwise."""
        if self.compute != torch.float16:
            return None
        return torch.amp.GradScaler(self.device_type, init_scale=FLOAT16_INITIAL_SCALE)

    def fsdp_policy(self) -> Any:
        """FSDP2's mixed-precision policy: gather in the compute dtype, reduce gradients in float32."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if not self.mixed:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=self.compute, reduce_dtype=self.master)

    def describe(self) -> str:
        """One line for the start-up banner."""
        if not self.mixed:
            return f"compute and master weights {dtype_name(self.master)}"
        scaled = ", loss scaling" if self.compute == torch.float16 else ""
        return (f"compute {dtype_name(self.compute)}, master weights and optimizer state "
                f"{dtype_name(self.master)}{scaled}")


def compute_dtype(config: TrainingConfig) -> torch.dtype:
    """The dtype forward passes compute in: ``--dtype`` as `TrainingConfig.resolved_dtype` resolves it."""
    return TORCH_DTYPES.get(config.resolved_dtype().dtype, torch.bfloat16)  # "auto" only arises on GPUs


def precision_for(config: TrainingConfig, world_size: int = 1) -> Precision:
    """The precision `config` asks for: compute in its resolved ``--dtype``, masters in float32."""
    compute = compute_dtype(config)
    device_type = "cuda" if config.device.startswith("cuda") else "cpu"
    sharded = world_size > 1 and config.data_parallel == "fsdp"
    return Precision(compute=compute, device_type=device_type, sharded=sharded)
