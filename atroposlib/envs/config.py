"""`BaseEnvConfig`: every setting of an environment, with Atropos's names and defaults."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from atroposlib.envs.types import EvalHandlingEnum

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


class BaseEnvConfig(BaseModel):
    """Settings shared by all environments; subclasses add their own fields."""

    model_config = ConfigDict(extra="ignore", use_enum_values=False)

    group_size: int = Field(default=4, description="Rollouts per group, scored together.")
    max_num_workers: int = Field(
        default=-1, description="Concurrent rollout workers; -1: max_num_workers_per_node x inference servers."
    )
    max_eval_workers: int = Field(default=16, description="Concurrency cap for evaluation helpers.")
    max_num_workers_per_node: int = Field(default=8, description="Workers per inference server when max_num_workers is -1.")
    steps_per_eval: int = Field(default=100, description="Evaluate every this many trainer steps; <= 0 disables.")
    max_token_length: int = Field(default=2048, description="Generation budget in tokens.")
    eval_handling: EvalHandlingEnum = Field(
        default=EvalHandlingEnum.STOP_TRAIN,
        description="What rollouts do while an evaluation runs: STOP_TRAIN cancels them and starts none, "
        "LIMIT_TRAIN keeps eval_limit_ratio of the workers, NONE carries on.",
    )
    eval_limit_ratio: float = Field(default=0.5, description="Share of workers kept during evaluation with LIMIT_TRAIN.")
    inference_weight: float = Field(default=1.0, description="Share of inference for this env; -1 to ignore.")
    batch_size: int = Field(
        default=-1, description="Trainer batch size; serve mode takes it from the trainer's registration at the API."
    )
    max_batches_offpolicy: int = Field(
        default=3, description="Queue cap in trainer batches before new rollouts pause; <= 0 disables."
    )
    tokenizer_name: str = Field(
        default="NousResearch/DeepHermes-3-Llama-3-3B-Preview", description="Hugging Face tokenizer (id or folder)."
    )
    use_wandb: bool = Field(default=True, description="Log to Weights & Biases.")
    rollout_server_url: str = Field(default="http://localhost:8000", description="Trajectory API base URL.")
    total_steps: int = Field(
        default=1000, description="serve: stop at this trainer step; process: groups to write; -1: from the API."
    )
    wandb_name: Optional[str] = Field(default=None, description="Run name prefix and the env's name at the API.")
    num_rollouts_to_keep: int = Field(default=32, description="Groups kept for the W&B rollout table.")
    num_rollouts_per_group_for_logging: int = Field(
        default=1, description="Rollouts per group in the W&B table; -1: the whole group."
    )
    ensure_scores_are_not_same: bool = Field(default=True, description="Drop groups whose scores are all equal.")
    data_path_to_save_groups: Optional[str] = Field(default=None, description="Also write accepted groups to this JSONL.")
    data_dir_to_save_evals: Optional[str] = Field(default=None, description="Folder for evaluation results.")
    min_items_sent_before_logging: int = Field(default=2, description="Groups sent before a per-step W&B log.")
    include_messages: bool = Field(default=False, description="Synthesize messages from tokens when missing.")
    min_batch_allocation: Optional[float] = Field(
        default=None, ge=0.0, le=1.0, description="Minimum share of each batch reserved for this env."
    )
    worker_timeout: float = Field(default=600, description="Seconds before an in-flight rollout is cancelled; -1 disables.")
    thinking_mode: bool = Field(default=False, description="Ask the model to reason before answering.")
    reasoning_effort: Optional[str] = Field(default=None, description="none, minimal, low, medium, high or xhigh.")
    max_reasoning_tokens: Optional[int] = Field(default=None, description="Reasoning budget (1024 to 32000).")
    custom_thinking_prompt: Optional[str] = Field(default=None, description="System prompt for thinking mode.")
    spool_dir: Optional[str] = Field(
        default=None, description="Where groups the API could not take wait to be re-sent, also after a restart; "
        "null: <user cache dir>/atroposlib/spool/<wandb_name>."
    )
    spool_max_bytes: int = Field(default=2 * 1024**3, description="Spool size at which new rollouts pause.")
    cancel_workers_on_backpressure: bool = Field(
        default=False, description="Cancel in-flight rollouts when the queue is full (Atropos's behaviour)."
    )
    worker_timeout_retries: int = Field(default=1, description="Times a timed-out item is retried before it is dropped.")
    process_concurrency: int = Field(default=-1, description="Groups generated at once in process mode; -1: max_num_workers.")
    process_max_consecutive_failures: int = Field(
        default=100, description="process mode gives up after this many failed groups in a row."
    )
    disconnect_on_exit: bool = Field(default=True, description="Tell the API on orderly shutdown.")
    progress_log_interval: float = Field(
        default=30.0, description="Seconds between serve mode's progress lines (step, groups sent, dropped by reason, "
        "queue); <= 0: none. A summary line is always logged at the end."
    )

    @field_validator("reasoning_effort")
    @classmethod
    def _known_effort(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and value not in REASONING_EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}")
        return value

    @field_validator("max_reasoning_tokens")
    @classmethod
    def _reasoning_budget(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and not 1024 <= value <= 32000:
            raise ValueError("max_reasoning_tokens must be between 1024 and 32000")
        return value
