"""The command lines of the trainer: ``atropos-grpo`` (every mode) and ``atropos-grpo-run``
(one command that starts vLLM and trains in ``shared_vllm`` mode).

The flag names and defaults are Atropos's, so its commands work unchanged; each flag's
``dest`` is the `TrainingConfig` field it sets (except ``--gpu-memory-utilization``, whose
``dest`` is ``gpu_memory_utilization`` as in Atropos). ``--help`` shows every default. The
flags of fields Atropos's trainer never read (``--num-inference-nodes``) are accepted but hidden.
"""

from __future__ import annotations

import argparse
import re
from typing import Callable, Optional

from pydantic import ValidationError

from atroposlib.local.allocator import ALLOCATORS
from atroposlib.local.cpu import DTYPES
from atroposlib.local.help_format import DefaultsHelpFormatter
from example_trainer.config import (DATA_PARALLEL, KL_REFERENCES, LOSS_TYPES, OPTIMIZERS, SCALE_REWARDS, WEIGHT_BRIDGE_MODES,
                                   TrainingConfig, default_device)

_INDEX = re.compile(r"\d+")
_RANGE = re.compile(r"(\d+)\s*-\s*(\d+)")
# argparse dest -> TrainingConfig field, where the two differ.
_DEST_TO_FIELD = {"gpu_memory_utilization": "vllm_gpu_memory_utilization"}


def parse_layer_indices(value: str) -> Optional[list[int]]:
    """Layer indices from ``"20-31"``, ``"0-3,28-31"`` or ``"0,1,2"``: sorted, without
    duplicates; None for an empty value. An argparse ``type``: bad input raises
    `argparse.ArgumentTypeError` naming the offending part."""
    indices: set[int] = set()
    for part in (piece.strip() for piece in value.split(",")):
        if not part:
            continue
        if _INDEX.fullmatch(part):
            indices.add(int(part))
            continue
        span = _RANGE.fullmatch(part)
        if span is None:
            why = "indices must be >= 0" if part.startswith("-") else "expected N or START-END"
            raise argparse.ArgumentTypeError(f"invalid layer index {part!r} in {value!r}: {why}")
        start, end = int(span.group(1)), int(span.group(2))
        if start > end:
            raise argparse.ArgumentTypeError(f"invalid layer range {part!r} in {value!r}: start is after end")
        indices.update(range(start, end + 1))
    return sorted(indices) or None


def _model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Model")
    group.add_argument("--model", "--model-name", dest="model_name", required=True,
                       help="Hugging Face model id or local directory to train (also vLLM's served model name)")


def _training_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Training")
    group.add_argument("--lr", type=float, default=1e-5, help="learning rate")
    group.add_argument("--training-steps", type=int, default=10, help="optimizer steps; each consumes one API batch")
    group.add_argument("--batch-size", type=int, default=2, help="sequences per forward pass")
    group.add_argument("--seq-len", type=int, default=2048, help="longest sequence (registered as max_token_len)")
    group.add_argument("--gradient-accumulation-steps", type=int, default=32,
                       help="forward passes per optimizer step; the API batch is batch-size x this")
    group.add_argument("--warmup-steps", type=int, default=0, help="steps of linear learning-rate warm-up (0: none)")
    group.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw_8bit",
                       help="adamw, adamw_8bit (needs bitsandbytes; falls back to adamw without it) or adafactor")
    group.add_argument("--adafactor-scale-parameter", action="store_true",
                       help="Adafactor's scale_parameter (with --optimizer adafactor)")
    group.add_argument("--adafactor-relative-step", action="store_true",
                       help="Adafactor's relative_step (with --optimizer adafactor)")
    group.add_argument("--device", default=default_device(), help="torch device to train on")
    group.add_argument("--cpu-allocator", choices=ALLOCATORS, default="auto",
                       help="memory allocator on a CPU: the trainer starts itself again with tcmalloc preloaded "
                            "(steps ~1.4x faster); auto: tcmalloc when installed, else the system's")
    group.add_argument("--save-path", default="trained_model_checkpoints", help="directory of the checkpoints")
    group.add_argument("--checkpoint-interval", type=int, default=3,
                       help="steps between recovery checkpoints in shared_vllm mode (0: only the final one)")
    group.add_argument("--resume-from", default=None,
                       help="continue from this checkpoint directory (step, optimizer and RNG state)")
    group.add_argument("--save-total-limit", "--keep-last-n", dest="save_total_limit", type=int, default=3,
                       help="step checkpoints to keep: the newest N, and the newest with optimizer state to resume "
                            "from (0: all; final_model is always kept)")
    group.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                       help="recompute activations in the backward pass, saving memory for a third more compute "
                            "(default: on a GPU, as Atropos; off on a CPU)")
    group.add_argument("--share-prompt-prefix", action=argparse.BooleanOptionalAction, default=None,
                       help="keep each micro-batch to one group and run the prompt its rollouts share through the "
                            "model once: the same logits over fewer positions (default: on, off with "
                            "--gradient-checkpointing, which turns the attention cache off)")
    group.add_argument("--pad-to-multiple", type=int, default=None,
                       help="pad each micro-batch's length to a multiple of this (default: 64 on a GPU, as Atropos; "
                            "1 on a CPU, where padding only costs)")


def _grpo_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GRPO")
    group.add_argument("--loss-type", choices=LOSS_TYPES, default="grpo",
                       help="grpo: token mean per sequence, then mean over sequences; dr_grpo: token sum over "
                            "sequences x --loss-norm-length; dapo: token mean over the whole batch; gspo: "
                            "one ratio per sequence (geometric mean of its token ratios)")
    group.add_argument("--clip-eps", type=float, default=0.2, help="PPO clip: the ratio is clipped to 1 +/- this")
    group.add_argument("--epsilon-high", type=float, default=None,
                       help="upper clip bound 1 + this (clip-higher, DAPO); default: --clip-eps")
    group.add_argument("--dual-clip", type=float, default=None, metavar="C",
                       help="dual clip: a negative-advantage token's loss is at most -C x advantage (C > 1, e.g. 3)")
    group.add_argument("--tis-cap", type=float, default=None, metavar="C",
                       help="truncated importance sampling: weight each token by min(trainer/sampler probability, "
                            "C), with the PPO ratio against the trainer's own probabilities (TRL's correction)")
    group.add_argument("--scale-rewards", choices=SCALE_REWARDS, default="group",
                       help="advantages: centred scores divided by the group's std, the batch's, or not at all")
    group.add_argument("--kl-coef", type=float, default=0.0, help="weight of a k3 KL penalty (TRL's beta)")
    group.add_argument("--kl-reference", choices=KL_REFERENCES, default="sampler",
                       help="what the KL penalty is measured against: the sampler's log-probabilities or a frozen "
                            "copy of the starting model (in LoRA modes: the model without adapters)")
    group.add_argument("--loss-norm-length", type=int, default=None,
                       help="dr_grpo's constant length (default: --seq-len)")
    group.add_argument("--match-sampler-truncation", action=argparse.BooleanOptionalAction, default=True,
                       help="score each token under the top-p/top-k/min-p truncated distribution it was sampled "
                            "from, as vLLM's processed logprobs are (off: the full distribution, as TRL)")
    group.add_argument("--max-staleness", type=int, default=None,
                       help="train only on groups sampled by weights at most this many steps old, registered with "
                            "the API, which drops older ones (default: 2 x --vllm-restart-interval; -1: no bound)")
    group.add_argument("--use-env-advantages", action="store_true",
                       help="use the per-token advantages environments send instead of normalised scores")
    group.add_argument("--missing-logprobs", choices=("on_policy", "error"), default="on_policy",
                       help="rollouts without inference logprobs: on_policy trains on them with ratio 1, "
                            "error stops the run")


def _vllm_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("vLLM", description=(
        "The trainer's vLLM server reports each sampled token's log-probability under the distribution it was "
        "drawn from (--logprobs-mode processed_logprobs: after temperature, min-p, top-k and top-p), and the "
        "policy version (training step) of the weights it serves."))
    group.add_argument("--vllm-port", type=int, default=9001, help="port of the vLLM server")
    group.add_argument("--vllm-gpu", type=int, default=None, help="GPU index for vLLM (default: the trainer's)")
    group.add_argument("--gpu-memory-utilization", "--vllm-gpu-memory-utilization", dest="gpu_memory_utilization",
                       type=float, default=0.45, help="fraction of GPU memory vLLM may use")
    group.add_argument("--max-model-len", type=int, default=4096, help="vLLM's context length")
    group.add_argument("--dtype", choices=DTYPES, default="auto",
                       help="compute dtype of training and vLLM's dtype (the trained weights and optimizer "
                            "state stay float32); auto: bfloat16 on GPUs and on CPUs with amx_bf16, else float32 "
                            "(with avx512_bf16 alone bfloat16 is little faster a step and learns less per step)")
    group.add_argument("--vllm-dtype", choices=DTYPES, default=None,
                       help="the dtype the trainer's vLLM serves the weights in (default: --dtype's). float32 "
                            "serves the float32 weights exactly, but beside bfloat16 compute the trainer's "
                            "log-probabilities no longer match the sampler's (many tokens clipped): measured worse")
    group.add_argument("--vllm-restart-interval", type=int, default=3, help="steps between weight syncs to vLLM")
    group.add_argument("--vllm-stop-during-train", action="store_true",
                       help="stop vLLM while a step trains (when both share a GPU without headroom)")
    group.add_argument("--vllm-pause-during-train", action=argparse.BooleanOptionalAction, default=None,
                       help="freeze the trainer's vLLM's requests while a step trains (default: on a CPU, where "
                            "both share the cores and run faster taking turns)")
    group.add_argument("--vllm-fork-server", action=argparse.BooleanOptionalAction, default=True,
                       help="on a CPU, fork each restart of the trainer's vLLM from a process that imported vLLM "
                            "once: 4.9 s instead of 10.7 s to answer on 2 cores, for about 0.5 GB of memory")
    group.add_argument("--vllm-python", default=None,
                       help="python that has vLLM (default: this one if vLLM imports, else the atropos-vllm runtime)")


def _api_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("API")
    group.add_argument("--atropos-url", default="http://localhost:8000", help="trajectory API")
    group.add_argument("--max-prefetch-batches", type=int, default=4,
                       help="batches leased ahead, the one training included")
    group.add_argument("--lease-seconds", type=float, default=1800.0,
                       help="a leased batch not acknowledged within this is served again")
    group.add_argument("--replace-run", action="store_true",
                       help="when the API holds a run registered with another batch size, max token length or "
                            "staleness bound, replace its settings (its queued groups stay) instead of stopping")


def _wandb_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("W&B")
    group.add_argument("--use-wandb", action="store_true", help="log to Weights & Biases (needs --wandb-project)")
    group.add_argument("--wandb-project", default=None, help="W&B project, also registered with the API")
    group.add_argument("--wandb-group", default=None, help="W&B group (random when unset)")


def _mode_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Mode")
    group.add_argument("--weight-bridge-mode", choices=WEIGHT_BRIDGE_MODES, default="none",
                       help="how new weights reach vLLM: none (checkpoint + restart), reload (swap in place), "
                            "lora_only (hot-swap adapters), lora_restart (adapters + restart), "
                            "shared_vllm (CUDA IPC)")
    group.add_argument("--vllm-config-path", default=None,
                       help="Atropos's vllm_bridge_config.json for shared_vllm; accepted, not read by this release")
    group.add_argument("--train-layer-indices", type=parse_layer_indices, default=None,
                       help="train only these layers, e.g. 20-31 or 0-3,28-31 (default: all)")
    group.add_argument("--inference-server-urls", nargs="+", default=None, metavar="URL",
                       help="reload mode: instead of starting vLLM, give each checkpoint to these running servers "
                            "(the bundled example_trainer/vllm_api_server.py, http://HOST:PORT; a trailing /v1 "
                            "is dropped), which must see --save-path at the same path (a shared file system); "
                            "bearer key: $ATROPOS_INFERENCE_API_KEY")
    group.add_argument("--slurm-inference-servers", action="store_true",
                       help="reload mode: give each checkpoint to the Slurm job's inference servers, found by "
                            "the Slurm discovery of environments' --slurm (SLURM.md); outside Slurm or in a "
                            "one-node job, to --inference-server-urls")


def _lora_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LoRA")
    group.add_argument("--lora-r", type=int, default=16, help="adapter rank")
    group.add_argument("--lora-alpha", type=int, default=32, help="adapter scaling numerator")
    group.add_argument("--lora-dropout", type=float, default=0.05, help="adapter dropout")
    group.add_argument("--lora-target-modules", nargs="+", default=None, metavar="M",
                       help="module names to adapt (default: q_proj v_proj)")
    group.add_argument("--lora-layer-indices", type=parse_layer_indices, default=None,
                       help="adapt only these layers, same syntax as --train-layer-indices (default: all)")


def _distributed_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Distributed", description=(
        "Several processes train together on torch.distributed: launch with `torchrun --nproc-per-node N` "
        "(which sets the rank and world size), or give each process these flags."))
    group.add_argument("--data-parallel", choices=DATA_PARALLEL, default="ddp",
                       help="ddp: every process holds the model, gradients are averaged; fsdp: parameters, "
                            "gradients and optimizer state sharded (FSDP2, full models only)")
    group.add_argument("--world-size", type=int, default=1, help="processes training together (without torchrun)")
    group.add_argument("--trainer-rank", type=int, default=0, help="this process's rank (without torchrun)")
    group.add_argument("--init-method", default="env://",
                       help="how the processes find each other, e.g. tcp://HOST:PORT (without torchrun)")


def _deprecated_args(parser: argparse.ArgumentParser) -> None:
    # Accepted so that old command lines still run; hidden because nothing reads them.
    parser.add_argument("--num-inference-nodes", type=int, default=0, help=argparse.SUPPRESS)


def _debug_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Debug")
    group.add_argument("--debug-loading", action="store_true", help="explain each step of loading the model")
    group.add_argument("--benchmark", action="store_true", help="print timings and memory per step")
    group.add_argument("--log-dir", default="./logs", help="directory of the log files (vLLM output)")


AddGroup = Callable[[argparse.ArgumentParser], None]


def _parser(prog: str, description: str, groups: list[AddGroup]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=DefaultsHelpFormatter)
    for add in groups:
        add(parser)
    return parser


def create_full_parser() -> argparse.ArgumentParser:
    """The parser of ``atropos-grpo``: every group."""
    return _parser("atropos-grpo", "Train a model with GRPO on batches from the Atropos trajectory API.", [
        _model_args, _training_args, _grpo_args, _vllm_args, _api_args, _wandb_args, _mode_args, _lora_args,
        _distributed_args, _deprecated_args, _debug_args,
    ])


def create_unified_parser() -> argparse.ArgumentParser:
    """The parser of ``atropos-grpo-run``: no mode, LoRA or distributed flags (the mode is shared_vllm)."""
    return _parser("atropos-grpo-run", "Start vLLM with shared weights and train against it (one GPU, one command).", [
        _model_args, _training_args, _grpo_args, _vllm_args, _api_args, _wandb_args, _debug_args,
    ])


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """``atropos-grpo``'s arguments (`sys.argv` when `argv` is None)."""
    return create_full_parser().parse_args(argv)


def config_from_args(args: argparse.Namespace) -> TrainingConfig:
    """The `TrainingConfig` the parsed flags describe (fields without a flag keep their defaults).

    Raises ValueError naming every invalid value on one line (e.g. ``--lr: Input should be
    greater than 0``)."""
    values = {_DEST_TO_FIELD.get(dest, dest): value for dest, value in vars(args).items()}
    known = {name: value for name, value in values.items() if name in TrainingConfig.model_fields}
    try:
        return TrainingConfig(**known)
    except ValidationError as err:
        raise ValueError(describe_errors(err)) from None


def describe_errors(err: ValidationError) -> str:
    """The validation errors as ``--flag-name: message`` parts of one line."""
    parts = []
    for error in err.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        parts.append(f"--{field.replace('_', '-')}: {error['msg']}" if field else error["msg"])
    return "; ".join(parts)


def parse_config(argv: Optional[list[str]] = None, parser: Optional[argparse.ArgumentParser] = None) -> TrainingConfig:
    """Parse `argv` with `parser` (default: ``atropos-grpo``'s) into a config; an invalid value
    exits with argparse's usage line and one error line (status 2)."""
    parser = parser or create_full_parser()
    args = parser.parse_args(argv)
    try:
        return config_from_args(args)
    except ValueError as err:
        parser.error(str(err))
