"""`TrainingConfig`: everything one GRPO training run is told, in one validated object.

The fields and defaults are Atropos 0.4.0's (a run configured for its trainer means the
same here), with these changes:

* ``dtype`` defaults to ``auto``: bfloat16 on a GPU and on a CPU with AMX (``amx_bf16``),
  float32 on other CPUs (without bf16 instructions bfloat16 is several times slower; with
  ``avx512_bf16`` alone it is little faster a step and learned less per step, since its
  forward passes see the float32 weights rounded). `TrainingConfig.resolved_dtype` makes the
  choice and says why.
* Added: ``resume_from``, ``use_env_advantages``, ``missing_logprobs``,
  ``vllm_stop_during_train``, ``kl_coef``, ``max_prefetch_batches``, ``lease_seconds``,
  ``vllm_python``, ``save_total_limit``, ``log_dir``, the ``reload`` weight-bridge mode, and
  ``inference_server_urls`` / ``slurm_inference_servers``: in ``reload`` mode, inference
  servers the trainer did not start (other machines, a Slurm job's inference nodes) take
  each checkpoint instead of a vLLM of its own (`example_trainer.inference_servers`).
* Added for the loss (`example_trainer.loss`): ``loss_type``, ``epsilon_high``,
  ``dual_clip``, ``tis_cap``, ``scale_rewards``, ``kl_reference``, ``loss_norm_length``,
  ``match_sampler_truncation``; for the loop: ``max_staleness`` (registered with the API,
  which serves no group sampled by older weights), ``pad_to_multiple`` (Atropos's 64 on a
  GPU, no rounding on a CPU), ``gradient_checkpointing`` (Atropos's on a GPU, off on a CPU),
  ``share_prompt_prefix`` (a group's shared prompt runs once per micro-batch; off with
  gradient checkpointing),
  ``vllm_pause_during_train`` (on a CPU the trainer's vLLM freezes its requests while a step
  trains), ``vllm_fork_server`` (on a CPU a run that restarts its vLLM forks each server from
  a process that imported vLLM once) and ``replace_run`` (register over a stored run
  whose settings differ, instead of stopping with an error).
* ``trainer_rank``, ``world_size`` and ``init_method`` (never read by Atropos's trainer) now
  mean what their names say: with ``world_size > 1`` the trainer joins a torch.distributed
  group as that rank (torchrun sets them by itself); ``data_parallel`` picks DDP or FSDP2.
* ``num_inference_nodes`` and ``single_copy`` were never read by Atropos's trainer. They are
  still accepted, so old configurations load, but setting one to anything but its default
  warns (`DeprecationWarning`).
"""

from __future__ import annotations

import warnings
from typing import Iterable, Literal, Optional

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from atroposlib.local.allocator import Allocator
from atroposlib.local.cpu import DTYPES, Dtype, DtypeChoice, choose_dtype, read_cpu
from example_trainer.inference_servers import server_root

DataParallel = Literal["ddp", "fsdp"]
DATA_PARALLEL: tuple[DataParallel, ...] = ("ddp", "fsdp")
WeightBridgeMode = Literal["shared_vllm", "lora_only", "lora_restart", "none", "reload"]
WEIGHT_BRIDGE_MODES: tuple[WeightBridgeMode, ...] = ("shared_vllm", "lora_only", "lora_restart", "none", "reload")
OptimizerName = Literal["adamw", "adamw_8bit", "adafactor"]
OPTIMIZERS: tuple[OptimizerName, ...] = ("adamw", "adamw_8bit", "adafactor")
MissingLogprobs = Literal["error", "on_policy"]
LossType = Literal["grpo", "dr_grpo", "dapo", "gspo"]
LOSS_TYPES: tuple[LossType, ...] = ("grpo", "dr_grpo", "dapo", "gspo")
ScaleRewards = Literal["group", "batch", "none"]
SCALE_REWARDS: tuple[ScaleRewards, ...] = ("group", "batch", "none")
KlReference = Literal["sampler", "model"]
KL_REFERENCES: tuple[KlReference, ...] = ("sampler", "model")
# Pad each micro-batch's label width to a multiple of this on a GPU (Atropos's rule: kernels
# like aligned shapes); on a CPU padding only costs, so rollouts are padded to the longest.
GPU_PAD_MULTIPLE = 64
CPU_PAD_MULTIPLE = 1
# --max-staleness's default, in weight syncs: rollouts may lag one sync behind the natural lag.
STALENESS_SYNCS = 2
__all__ = ["DATA_PARALLEL", "DTYPES", "Dtype", "DtypeChoice", "KL_REFERENCES", "LOSS_TYPES", "OPTIMIZERS", "SCALE_REWARDS",
           "TrainingConfig", "WEIGHT_BRIDGE_MODES"]

DEFAULT_LORA_TARGETS = ["q_proj", "v_proj"]
# Field name -> default of the fields kept only so that old configurations still load.
DEPRECATED_DEFAULTS: dict[str, object] = {"num_inference_nodes": 0, "single_copy": False}
# Only `reload` can hand weights to a server the trainer does not run: the other modes restart
# their own vLLM, hot-swap adapters into the one on --vllm-port, or share its GPU memory.
REMOTE_NEEDS_RELOAD = ("--inference-server-urls and --slurm-inference-servers need --weight-bridge-mode reload "
                       "(remote servers read each checkpoint in place); mode {mode} works with a vLLM on this "
                       "machine only")


def default_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu`` (torch is imported only when asked)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class TrainingConfig(BaseModel):
    """The settings of one `atropos-grpo` run (see the module docstring for what changed)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Model
    model_name: str = Field(min_length=1, description="HF model id or directory; also vLLM's served model name")

    # Training
    lr: float = Field(1e-5, gt=0, description="learning rate")
    training_steps: int = Field(10, ge=1, description="optimizer steps, one trajectory-API batch each")
    batch_size: int = Field(2, ge=1, description="sequences per forward pass (micro-batch)")
    seq_len: int = Field(2048, ge=1, description="longest sequence, registered as max_token_len")
    gradient_accumulation_steps: int = Field(32, ge=1, description="micro-batches per optimizer step")
    warmup_steps: int = Field(0, ge=0, description="linear learning-rate warm-up steps (0: none)")
    optimizer: OptimizerName = "adamw_8bit"
    adafactor_scale_parameter: bool = False
    adafactor_relative_step: bool = False
    device: str = Field(default_factory=default_device)
    cpu_allocator: Allocator = Field("auto", description="malloc for training on a CPU: auto (tcmalloc when "
                                                         "installed), tcmalloc (required) or system")
    save_path: str = "trained_model_checkpoints"
    checkpoint_interval: int = Field(3, description="steps between recovery checkpoints (shared_vllm); 0: final only")
    resume_from: Optional[str] = Field(None, description="checkpoint directory to continue from")
    save_total_limit: int = Field(3, ge=0, validation_alias=AliasChoices("save_total_limit", "keep_last_n"),
                                  description="step checkpoints kept, the newest (and the newest with optimizer "
                                              "state); 0: all")

    # GRPO
    loss_type: LossType = Field("grpo", description="policy loss: grpo, dr_grpo, dapo or gspo")
    clip_eps: float = Field(0.2, gt=0, lt=1)
    epsilon_high: Optional[float] = Field(None, gt=0, description="upper clip (clip-higher); None: clip_eps")
    dual_clip: Optional[float] = Field(None, gt=1, description="bound of negative-advantage losses (dual clip)")
    tis_cap: Optional[float] = Field(None, gt=0, description="truncated importance sampling: weight cap")
    scale_rewards: ScaleRewards = Field("group", description="divide centred scores by the group's std, the "
                                                              "batch's, or nothing")
    kl_coef: float = Field(0.0, ge=0, description="weight of the k3 KL penalty")
    kl_reference: KlReference = Field("sampler", description="KL against the sampler or a frozen reference model")
    loss_norm_length: Optional[int] = Field(None, ge=1, description="dr_grpo's constant length; None: seq_len")
    match_sampler_truncation: bool = Field(
        True, description="score tokens under the top-p/top-k/min-p truncated distribution they were sampled from")
    max_staleness: Optional[int] = Field(
        None, ge=-1, description="oldest weights (in steps) a trained group may come from; None: "
                                 f"{STALENESS_SYNCS} x vllm_restart_interval, -1: no bound")
    use_env_advantages: bool = Field(False, description="train on the API's per-token advantages when present")
    missing_logprobs: MissingLogprobs = Field(
        "on_policy", description="rows without inference logprobs: ratio 1 (on_policy) or refuse (error)")
    gradient_checkpointing: Optional[bool] = Field(
        None, description="recompute activations in the backward pass; None: on a GPU only")
    pad_to_multiple: Optional[int] = Field(
        None, ge=1, description=f"label width multiple; None: {GPU_PAD_MULTIPLE} on a GPU, {CPU_PAD_MULTIPLE} on a CPU")
    share_prompt_prefix: Optional[bool] = Field(
        None, description="run a group's shared prompt through the model once per micro-batch; None: unless "
                          "activations are recomputed (gradient checkpointing)")

    # vLLM
    vllm_restart_interval: int = Field(3, ge=1, description="steps between weight syncs")
    vllm_port: int = Field(9001, ge=1, le=65535)
    vllm_gpu: Optional[int] = Field(None, ge=0)
    vllm_gpu_memory_utilization: float = Field(0.45, gt=0, le=1)
    max_model_len: int = Field(4096, ge=1)
    dtype: Dtype = "auto"
    vllm_dtype: Optional[Dtype] = Field(
        None, description="the dtype the trainer's vLLM serves the weights in; None: the training dtype")
    vllm_stop_during_train: bool = Field(False, description="stop vLLM while a training step runs")
    vllm_pause_during_train: Optional[bool] = Field(
        None, description="freeze the trainer's vLLM's requests while a step trains; None: on a CPU only")
    vllm_python: Optional[str] = Field(None, description="python interpreter that has vLLM installed")
    vllm_fork_server: bool = Field(
        True, description="on a CPU, fork each restart of the trainer's vLLM from a process that imported it once "
                          "(faster restarts for about 0.5 GB of memory)")

    # Trajectory API
    atropos_url: str = "http://localhost:8000"
    replace_run: bool = Field(False, description="register even when the API holds a run with other settings")
    max_prefetch_batches: int = Field(4, ge=1, description="leased batches held at once, the one training included")
    lease_seconds: float = Field(1800.0, gt=0, le=86_400, description="how long a leased batch stays ours")

    # Weights & Biases
    use_wandb: bool = False
    wandb_project: Optional[str] = None
    wandb_group: Optional[str] = None

    # Weight-bridge mode
    weight_bridge_mode: WeightBridgeMode = "none"
    train_layer_indices: Optional[list[int]] = None
    vllm_config_path: Optional[str] = None
    inference_server_urls: Optional[list[str]] = Field(
        None, description="reload mode: running servers that take each checkpoint (http://HOST:PORT)")
    slurm_inference_servers: bool = Field(
        False, description="reload mode: the Slurm job's inference servers take each checkpoint")

    # LoRA
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    lora_target_modules: Optional[list[str]] = None
    lora_layer_indices: Optional[list[int]] = None

    # Debug and logs
    debug_loading: bool = False
    benchmark: bool = False
    log_dir: str = "./logs"

    # Distributed (torchrun sets RANK and WORLD_SIZE instead: `example_trainer.distributed`)
    data_parallel: DataParallel = Field("ddp", description="with several processes: DDP or FSDP2 (fully_shard)")
    trainer_rank: int = Field(0, ge=0, description="this process's rank, when not launched by torchrun")
    world_size: int = Field(1, ge=1, description="processes training together, when not launched by torchrun")
    init_method: str = Field("env://", description="how the processes find each other (torch.distributed)")

    # Deprecated: never read (see DEPRECATED_DEFAULTS).
    num_inference_nodes: int = 0
    single_copy: bool = False

    @field_validator("train_layer_indices", "lora_layer_indices")
    @classmethod
    def _sorted_unique_indices(cls, value: Optional[list[int]]) -> Optional[list[int]]:
        if value is None:
            return None
        if any(index < 0 for index in value):
            raise ValueError("layer indices must be >= 0")
        return sorted(set(value)) or None

    @field_validator("inference_server_urls")
    @classmethod
    def _server_roots(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value is None:
            return None
        try:
            return list(dict.fromkeys(server_root(url) for url in value))
        except ValueError as exc:
            raise PydanticCustomError("server_url", str(exc)) from None

    @model_validator(mode="after")
    def _remote_servers_need_reload(self) -> "TrainingConfig":
        if self.uses_remote_inference and self.weight_bridge_mode != "reload":
            # no prefix ("Value error, ...") and no field name: the message names the flags itself
            raise PydanticCustomError("remote_inference", REMOTE_NEEDS_RELOAD.format(mode=self.weight_bridge_mode))
        return self

    @model_validator(mode="after")
    def _rank_in_world(self) -> "TrainingConfig":
        if self.trainer_rank >= self.world_size:
            raise PydanticCustomError("rank", "--trainer-rank {rank} is outside a --world-size of {world} processes "
                                      "(ranks are 0 to world size - 1)",
                                      {"rank": self.trainer_rank, "world": self.world_size})
        return self

    @model_validator(mode="after")
    def _warn_deprecated(self) -> "TrainingConfig":
        for name, default in DEPRECATED_DEFAULTS.items():
            if getattr(self, name) != default:
                warnings.warn(f"TrainingConfig.{name} is deprecated and ignored (the trainer never used it)",
                              DeprecationWarning, stacklevel=2)
        return self

    @property
    def uses_remote_inference(self) -> bool:
        """Whether inference servers the trainer did not start take its weights (no vLLM of its own)."""
        return bool(self.inference_server_urls) or self.slurm_inference_servers

    @property
    def registered_batch_size(self) -> int:
        """Sequences per optimizer step: what the trainer registers as the API's batch size."""
        return self.batch_size * self.gradient_accumulation_steps

    @property
    def registered_max_staleness(self) -> Optional[int]:
        """The staleness bound registered with the API (None: no bound)."""
        if self.max_staleness is None:
            return STALENESS_SYNCS * self.vllm_restart_interval
        return None if self.max_staleness < 0 else self.max_staleness

    @property
    def pauses_vllm_during_train(self) -> bool:
        """Whether the trainer's own vLLM pauses while a step trains: on a CPU the two share the
        cores, and both run faster taking turns than competing."""
        if self.vllm_pause_during_train is not None:
            return self.vllm_pause_during_train
        return not self.device.startswith("cuda")

    @property
    def uses_gradient_checkpointing(self) -> bool:
        """Whether activations are recomputed in the backward pass: on a GPU memory is what
        runs out (Atropos always checkpointed); on a CPU compute is, and recomputing costs a
        third more of it."""
        if self.gradient_checkpointing is not None:
            return self.gradient_checkpointing
        return self.device.startswith("cuda")

    @property
    def shares_prompt_prefix(self) -> bool:
        """Whether micro-batches keep to one group and run its prompt once: it computes the same
        logits over fewer positions, but needs the attention cache that gradient checkpointing
        turns off (and a batch laid out whole, on one process)."""
        if self.share_prompt_prefix is not None:
            return self.share_prompt_prefix
        return not self.uses_gradient_checkpointing

    @property
    def pad_multiple(self) -> int:
        """The label-width multiple micro-batches are padded to on this run's device."""
        if self.pad_to_multiple is not None:
            return self.pad_to_multiple
        return GPU_PAD_MULTIPLE if self.device.startswith("cuda") else CPU_PAD_MULTIPLE

    @property
    def lora_targets(self) -> list[str]:
        """The LoRA target modules, ``q_proj`` and ``v_proj`` unless configured."""
        return list(self.lora_target_modules or DEFAULT_LORA_TARGETS)

    def resolved_vllm_dtype(self, cpu_flags: Optional[Iterable[str]] = None) -> DtypeChoice:
        """The dtype the trainer's vLLM serves in, and why: ``vllm_dtype``, else the training dtype."""
        if self.vllm_dtype is None:
            return self.resolved_dtype(cpu_flags)
        flags = read_cpu().flags if cpu_flags is None else cpu_flags
        chosen = choose_dtype(flags, self.vllm_dtype, gpu=self.device.startswith("cuda"))
        return chosen if self.vllm_dtype == "auto" else DtypeChoice(chosen.dtype, "asked for with --vllm-dtype")

    def resolved_dtype(self, cpu_flags: Optional[Iterable[str]] = None) -> DtypeChoice:
        """The dtype training and vLLM run in, and why. `cpu_flags` defaults to this machine's."""
        if self.dtype != "auto":
            return DtypeChoice(self.dtype, "asked for with --dtype")
        if self.device.startswith("cuda"):
            # Atropos trains in bfloat16 on GPUs; every GPU it supports has bf16 arithmetic.
            return DtypeChoice("bfloat16", "CUDA device: bfloat16")
        flags = set(read_cpu().flags if cpu_flags is None else cpu_flags)
        if "avx512_bf16" in flags and "amx_bf16" not in flags:
            # measured (README, "Against TRL"): a step only ~1.3x faster, and less learned per step,
            # since bfloat16 forward passes and sampling see the float32 weights rounded
            return DtypeChoice("float32", "the CPU has avx512_bf16 without amx_bf16: bfloat16 compute is little "
                                          "faster there and learns less per step (--dtype bfloat16 to use it)")
        return choose_dtype(flags)
