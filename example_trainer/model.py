"""The policy model the trainer updates, loaded ready for training.

`load_model_and_tokenizer` reads a Hugging Face causal LM (``config.model_name``, or the
checkpoint in ``config.resume_from``) with float32 weights to train (the master copy of
`example_trainer.precision`; forward passes compute in ``--dtype``), with FlashAttention-2
when it is installed on a GPU and PyTorch's SDPA otherwise, and (on a GPU, or with
``--gradient-checkpointing``) turns on non-reentrant gradient checkpointing
(activations are recomputed in the backward pass, which also works when the inputs of a
checkpointed block need no gradient, as with frozen layers or LoRA). Then either:

* full-model modes: ``train_layer_indices`` freezes every parameter outside the listed
  transformer blocks (``.layers.<i>.`` in its name); or
* LoRA modes (``lora_only``, ``lora_restart``): the base model is loaded in the compute
  dtype and frozen, and float32 PEFT adapters are added on ``lora_target_modules``
  (optionally only in ``lora_layer_indices``); with ``resume_from`` the adapter saved there
  is loaded, trainable, instead.

Dropout is switched off (every ``nn.Dropout``, LoRA's included, and the attention dropout):
the importance ratio compares the trainer's log-probabilities with the sampler's, and
dropout would make the trainer's a random draw of a different model. The model stays in
train mode, which gradient checkpointing needs.

`reference_logprobs` gives the frozen reference policy a KL penalty can be measured
against (``--kl-reference model``): the starting model, or in the LoRA modes the base
model with the adapters switched off (no second copy of the weights); a frozen copy is
loaded in the compute dtype.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path
from typing import Optional

import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from example_trainer.config import TrainingConfig
from example_trainer.data import MicroBatch
from example_trainer.logprobs import ReferenceLogprobs, sampled_token_logprobs
from example_trainer.precision import MASTER_DTYPE, compute_dtype, dtype_name

log = logging.getLogger("example_trainer")

LORA_MODES = ("lora_only", "lora_restart")
LAYER_PATTERN = re.compile(r"\.layers\.(\d+)\.")


def attention_implementation(device: str) -> str:
    """``flash_attention_2`` on a GPU with flash-attn installed, else ``sdpa``."""
    if device.startswith("cuda") and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def _dtype_argument(dtype: torch.dtype) -> dict[str, torch.dtype]:
    # transformers renamed `torch_dtype` to `dtype` in 4.56; older releases know only the first.
    name = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return {name: dtype}


def _load_causal_lm(source: str, config: TrainingConfig, dtype: torch.dtype, role: str) -> PreTrainedModel:
    attention = attention_implementation(config.device)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, attn_implementation=attention, **_dtype_argument(dtype))
    except (ImportError, ValueError) as exc:
        if attention == "sdpa":
            raise
        log.warning("FlashAttention-2 could not be used (%s): loading with sdpa", exc)
        attention = "sdpa"
        model = AutoModelForCausalLM.from_pretrained(source, attn_implementation=attention, **_dtype_argument(dtype))
    choice = config.resolved_dtype()
    print(f"[model] {source}: {role} in {dtype_name(dtype)}, compute in {choice.dtype} ({choice.reason}), "
          f"attention {attention}", flush=True)
    return model


def layer_count(model: PreTrainedModel) -> int:
    """The number of transformer blocks, from the model's config."""
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(model.config, name, None)
        if isinstance(value, int):
            return value
    raise RuntimeError(f"cannot tell how many layers {type(model).__name__} has (no num_hidden_layers in its config)")


def _check_indices(model: PreTrainedModel, indices: list[int], flag: str) -> None:
    count = layer_count(model)
    invalid = [i for i in indices if i >= count]
    if invalid:
        raise ValueError(f"{flag} {invalid}: the model has {count} layers (0-{count - 1})")


def apply_train_layer_filter(model: PreTrainedModel, indices: Optional[list[int]]) -> None:
    """Freeze every parameter outside the transformer blocks `indices` (None: train everything)."""
    if indices is None:
        return
    _check_indices(model, indices, "--train-layer-indices")
    allowed, trainable, total = set(indices), 0, 0
    for name, param in model.named_parameters():
        match = LAYER_PATTERN.search(name)
        param.requires_grad_(bool(match and int(match.group(1)) in allowed))
        total += param.numel()
        trainable += param.numel() if param.requires_grad else 0
    if trainable == 0:
        raise RuntimeError(f"--train-layer-indices {indices} matched no parameter (no '.layers.<i>.' in their names)")
    print(f"[model] training layers {sorted(allowed)} only: {trainable:,} of {total:,} parameters "
          f"({100 * trainable / total:.1f}%)", flush=True)


def _wrap_lora(model: PreTrainedModel, config: TrainingConfig) -> PreTrainedModel:
    try:
        from peft import LoraConfig, PeftModel, TaskType, get_peft_model
    except ImportError as exc:
        raise RuntimeError("LoRA modes need PEFT: pip install 'atroposlib[example-trainer]'") from exc
    if config.resume_from:
        return PeftModel.from_pretrained(model, config.resume_from, is_trainable=True)
    if config.lora_layer_indices is not None:
        _check_indices(model, config.lora_layer_indices, "--lora-layer-indices")
    lora = LoraConfig(task_type=TaskType.CAUSAL_LM, r=config.lora_r, lora_alpha=config.lora_alpha,
                      lora_dropout=config.lora_dropout, target_modules=config.lora_targets, bias="none",
                      layers_to_transform=config.lora_layer_indices)
    return get_peft_model(model, lora)


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each layer's activations in the backward pass instead of keeping them."""
    model.config.use_cache = False  # the KV cache is useless in training and conflicts with checkpointing
    # With frozen embeddings no block input requires grad; this keeps the checkpointed graph connected.
    model.enable_input_require_grads()
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name; the old one warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout of `model` to 0 (modules and attention); returns how many there were."""
    count = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
            count += 1
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
            count += 1
    return count


def trained_in_master_dtype(model: torch.nn.Module) -> int:
    """Make every trainable parameter float32 (PEFT keeps adapters of a low-precision base in
    float32 already); returns how many were cast."""
    cast = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype != MASTER_DTYPE:
            param.data = param.data.to(MASTER_DTYPE)
            cast += 1
    return cast


def _tokenizer_source(config: TrainingConfig) -> str:
    if config.resume_from and (Path(config.resume_from) / "tokenizer_config.json").exists():
        return config.resume_from
    return config.model_name


def load_model_and_tokenizer(config: TrainingConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model to train (on ``config.device``, in train mode) and its tokenizer."""
    lora = config.weight_bridge_mode in LORA_MODES
    source = config.model_name if lora or not config.resume_from else config.resume_from
    tokenizer = AutoTokenizer.from_pretrained(_tokenizer_source(config))
    # LoRA trains adapters only: the frozen base never changes, so the compute dtype loses nothing
    weights_dtype = compute_dtype(config) if lora else MASTER_DTYPE
    model = _load_causal_lm(source, config, weights_dtype, "frozen base" if lora else "weights to train")
    if lora:
        if config.train_layer_indices is not None:
            log.warning("--train-layer-indices applies to full-model modes; LoRA uses --lora-layer-indices")
        model = _wrap_lora(model, config)
    else:
        apply_train_layer_filter(model, config.train_layer_indices)
    trained_in_master_dtype(model)
    if config.uses_gradient_checkpointing:
        enable_gradient_checkpointing(model)
    disable_dropout(model)
    model.to(config.device)
    model.train()
    return model, tokenizer


def reference_logprobs(model: torch.nn.Module, config: TrainingConfig) -> Optional[ReferenceLogprobs]:
    """The reference policy's log-probabilities of a micro-batch's labels (under each
    rollout's sampling distribution), when the KL penalty is measured against a frozen
    model; None otherwise."""
    if config.kl_reference != "model" or config.kl_coef <= 0:
        return None
    if config.weight_bridge_mode in LORA_MODES:
        def base_without_adapters(micro: MicroBatch) -> torch.Tensor:
            with torch.no_grad(), model.disable_adapter():
                return sampled_token_logprobs(model, micro, config.match_sampler_truncation).logp

        return base_without_adapters
    frozen = _load_causal_lm(config.model_name, config, compute_dtype(config), "frozen reference")
    frozen.requires_grad_(False)
    disable_dropout(frozen)
    frozen.to(config.device).eval()

    def starting_model(micro: MicroBatch) -> torch.Tensor:
        with torch.no_grad():
            return sampled_token_logprobs(frozen, micro, config.match_sampler_truncation).logp

    return starting_model
