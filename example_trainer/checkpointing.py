"""Checkpoints: the trained weights plus everything needed to continue the run exactly.

A checkpoint is a directory under ``save_path``: ``step_{n}/`` or ``final_model/`` for the
full model (``model.safetensors`` and ``config.json`` from ``save_pretrained``, the
tokenizer files), ``adapter_step_{n}/`` or ``final_adapter/`` for a LoRA adapter (PEFT's
``save_pretrained``; the tokenizer goes once to ``tokenizer/``). Each also holds

* ``trainer_state.json``: `TrainerState` (step, model, API url, mode, dtype, when);
* ``optimizer.pt``: the optimizer's state, full and keyed by parameter name (torch's
  distributed-checkpoint layout), so that it loads at any world size, sharded or not
  (checkpoints of earlier releases, keyed by parameter index, still load in one process);
* ``rng_state.pt``: the torch (and CUDA), Python and NumPy random-number states, taken
  before anything else is written, so a resumed run draws the numbers it would have drawn.

Writing is atomic: everything goes to ``<name>.tmp-<pid>`` first, which is renamed into
place only when complete; a failure mid-way leaves the previous checkpoint of that name
untouched. With ``save_total_limit`` only the newest ``n`` step checkpoints are kept, and the newest
one with optimizer state (a weight-sync checkpoint is no point to resume from).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
from pydantic import BaseModel, Field, ValidationError

from example_trainer.distributed import full_optimizer_state, load_optimizer_state

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng_state.pt"


class CheckpointError(ValueError):
    """A directory is not a checkpoint this trainer can resume from."""


class TrainerState(BaseModel):
    """``trainer_state.json``: where the run stood when the checkpoint was written."""

    step: int = Field(ge=0, description="optimizer steps completed")
    model_name: Optional[str] = None
    atropos_url: Optional[str] = None
    weight_bridge_mode: Optional[str] = None
    dtype: Optional[str] = None
    written_at: float = Field(default_factory=time.time, description="Unix time the checkpoint was written")
    has_optimizer: bool = False


def save_checkpoint(model: Any, tokenizer: Any, save_path: str, step: int, is_final: bool = False, *,
                    optimizer: Optional[torch.optim.Optimizer] = None, state: Optional[TrainerState] = None,
                    save_total_limit: int = 0, state_dict: Optional[dict[str, torch.Tensor]] = None,
                    optimizer_state: Optional[dict[str, Any]] = None) -> str:
    """Write the full model to ``step_{step}/`` (``final_model/`` when final); returns its path.
    A distributed run passes the gathered `state_dict` and `optimizer_state` (its model is sharded)."""
    name = "final_model" if is_final else f"step_{step}"
    rng = _rng_state()
    with _atomic_dir(Path(save_path), name) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict if state_dict is not None else _contiguous_state_dict(model),
                              safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _write_run_state(tmp, step, rng, _optimizer_state(model, optimizer, optimizer_state), state)
    if not is_final and save_total_limit:
        _prune(Path(save_path), "step_", save_total_limit)
    return str(Path(save_path) / name)


def save_lora_checkpoint(model: Any, save_path: str, step: int, is_final: bool = False, *,
                         optimizer: Optional[torch.optim.Optimizer] = None, state: Optional[TrainerState] = None,
                         save_total_limit: int = 0, optimizer_state: Optional[dict[str, Any]] = None) -> str:
    """Write a PEFT model's adapter to ``adapter_step_{step}/`` (``final_adapter/`` when final)."""
    name = "final_adapter" if is_final else f"adapter_step_{step}"
    rng = _rng_state()
    with _atomic_dir(Path(save_path), name) as tmp:
        model.save_pretrained(tmp)
        _write_run_state(tmp, step, rng, _optimizer_state(model, optimizer, optimizer_state), state)
    if not is_final and save_total_limit:
        _prune(Path(save_path), "adapter_step_", save_total_limit)
    return str(Path(save_path) / name)


def save_tokenizer(tokenizer: Any, save_path: str) -> str:
    """Write the tokenizer to ``tokenizer/`` (the LoRA modes' adapters leave it out); returns its path."""
    with _atomic_dir(Path(save_path), "tokenizer") as tmp:
        tokenizer.save_pretrained(tmp)
    return str(Path(save_path) / "tokenizer")


def load_resume_state(path: str) -> TrainerState:
    """The `TrainerState` of the checkpoint at `path`; `CheckpointError` if it is not one."""
    state_file = Path(path) / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a trainer checkpoint: it has no {STATE_FILE} "
                              "(pass a step_N/, final_model/ or adapter directory this trainer wrote)")
    try:
        return TrainerState.model_validate_json(state_file.read_bytes())
    except ValidationError as err:
        raise CheckpointError(f"{state_file} is unreadable: {err.errors()[0]['msg']}") from None


def restore_optimizer_and_rng(path: str, optimizer: Optional[torch.optim.Optimizer],
                              model: Optional[torch.nn.Module] = None) -> None:
    """Load the optimizer state (if the checkpoint has one) into `optimizer` over `model`'s
    parameters, however many processes share them now, and the random-number states saved at `path`."""
    directory = Path(path)
    if optimizer is not None and (directory / OPTIMIZER_FILE).is_file():
        saved = torch.load(directory / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        if model is not None and any(isinstance(key, str) for key in saved.get("state", {})):
            load_optimizer_state(model, optimizer, saved)
        else:  # keyed by parameter index: an earlier release's single-process checkpoint
            optimizer.load_state_dict(saved)
    if (directory / RNG_FILE).is_file():
        _set_rng_state(torch.load(directory / RNG_FILE, weights_only=True))


def _optimizer_state(model: Any, optimizer: Optional[torch.optim.Optimizer],
                     given: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if given is not None or optimizer is None:
        return given
    return full_optimizer_state(model, optimizer)


@contextmanager
def _atomic_dir(root: Path, name: str) -> Iterator[Path]:
    """A fresh temporary directory, renamed to ``root/name`` (replacing it) if the block succeeds."""
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / name, root / f"{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # rename() cannot replace a non-empty directory: move the old one aside first. Between the
    # two renames the old copy is still whole, under <name>.old-<pid>.
    old = root / f"{name}.old-{os.getpid()}"
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _contiguous_state_dict(model: torch.nn.Module) -> Optional[dict[str, torch.Tensor]]:
    """The state dict with copies of tensors that are views into larger storages (vLLM's fused
    ``qkv_proj``/``gate_up_proj`` in shared_vllm mode), which safetensors cannot write; None
    when there are none, so that ``save_pretrained`` does its usual (tied-weight aware) save."""
    state = model.state_dict()
    views = {name for name, tensor in state.items()
             if not tensor.is_contiguous() or tensor.storage_offset() != 0
             or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size()}
    if not views:
        return None
    return {name: tensor.detach().clone().contiguous() if name in views else tensor for name, tensor in state.items()}


def _write_run_state(directory: Path, step: int, rng: dict[str, Any], optimizer_state: Optional[dict[str, Any]],
                     state: Optional[TrainerState]) -> None:
    if optimizer_state is not None:
        torch.save(optimizer_state, directory / OPTIMIZER_FILE)
    torch.save(rng, directory / RNG_FILE)
    fields = state.model_dump() if state is not None else {}
    fields.update(step=step, has_optimizer=optimizer_state is not None, written_at=time.time())
    (directory / STATE_FILE).write_text(json.dumps(TrainerState(**fields).model_dump(), indent=2) + "\n")


def _rng_state() -> dict[str, Any]:
    """Every random-number state, in types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
    }


def _set_rng_state(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = rng["numpy"]
    np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"],
                         numpy["has_gauss"], numpy["cached_gaussian"]))


def _prune(root: Path, prefix: str, keep: int) -> None:
    """Delete all but the newest `keep` ``<prefix><n>`` checkpoints under `root`, and the
    newest one with optimizer state (the point a run resumes from)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)")
    steps = sorted((int(match.group(1)), path) for path in root.iterdir()
                   if path.is_dir() and (match := pattern.fullmatch(path.name)))
    resumable = [path for _, path in steps if (path / OPTIMIZER_FILE).is_file()]
    for _, path in steps[:-keep]:
        if not resumable or path != resumable[-1]:
            shutil.rmtree(path)
