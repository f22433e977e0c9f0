"""The JSON shapes exchanged with the trajectory API, defined once for server and clients.

A *group* (`ScoredData`) is the unit an environment submits: ``len(tokens)`` sequences
scored together. The server stores each accepted group as an *item*: a JSON object with
exactly the fourteen keys of `ITEM_KEYS`, absent optionals being ``null``.

Non-finite floats (NaN, Infinity) are refused everywhere: JSON cannot carry them
portably, and one of them in a stored group would break every batch it lands in.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Integers the server stores as numbers must fit in 64 bits (SQLite, orjson).
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]

ITEM_KEYS: tuple[str, ...] = (
    "tokens",
    "masks",
    "scores",
    "advantages",
    "ref_logprobs",
    "messages",
    "generation_params",
    "inference_logprobs",
    "overrides",
    "group_overrides",
    "images",
    "env_id",
    "distill_token_ids",
    "distill_logprobs",
)

# Arrays that, when present, hold one entry per sequence of the group.
PER_SEQUENCE_AUX_KEYS: tuple[str, ...] = (
    "advantages",
    "ref_logprobs",
    "inference_logprobs",
    "distill_token_ids",
    "distill_logprobs",
    "overrides",
)

_WIRE_CONFIG = ConfigDict(extra="ignore", allow_inf_nan=False)


class ScoredData(BaseModel):
    """One scored group as submitted to ``/scored_data`` (and stored as an item)."""

    model_config = _WIRE_CONFIG

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: Optional[list[list[float]]] = None
    ref_logprobs: Optional[list[list[float]]] = None
    messages: Optional[list[list[dict[str, Any]]]] = None
    generation_params: Optional[dict[str, Any]] = None
    inference_logprobs: Optional[list[list[float]]] = None
    overrides: Optional[list[dict[str, Any]]] = None
    group_overrides: Optional[dict[str, Any]] = None
    images: Optional[Any] = None
    env_id: Optional[Int64] = None
    distill_token_ids: Optional[list[list[list[int]]]] = None
    distill_logprobs: Optional[list[list[list[float]]]] = None
    submission_id: Optional[str] = Field(
        default=None,
        max_length=128,
        description="Idempotency key: a repeat within the server's window is stored once.",
    )

    @field_validator("messages")
    @classmethod
    def _messages_have_role_and_content(
        cls, value: Optional[list[list[dict[str, Any]]]]
    ) -> Optional[list[list[dict[str, Any]]]]:
        for i, conversation in enumerate(value or ()):
            for j, message in enumerate(conversation):
                missing = [key for key in ("role", "content") if key not in message]
                if missing:
                    raise ValueError(
                        f"messages[{i}][{j}] lacks {' and '.join(missing)}"
                    )
        return value


class Registration(BaseModel):
    """A trainer's run configuration, body of ``POST /register``."""

    model_config = ConfigDict(extra="ignore")

    wandb_group: Optional[str]
    wandb_project: Optional[str]
    batch_size: Int64
    max_token_len: Int64
    checkpoint_dir: str
    save_checkpoint_interval: Int64
    starting_step: Int64
    num_steps: Int64
    replace: bool = Field(
        default=False,
        description="Replace the stored run configuration instead of keeping the first one.",
    )


class RegisterEnv(BaseModel):
    """An environment process announcing itself, body of ``POST /register-env``."""

    model_config = _WIRE_CONFIG

    max_token_length: Int64
    desired_name: str
    weight: Optional[float]
    group_size: int = Field(ge=1, le=2**31)
    min_batch_allocation: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    env_key: Optional[str] = Field(
        default=None,
        max_length=256,
        description="Stable identity: a disconnected record with the same key is reused.",
    )


class EnvIdentifier(BaseModel):
    """Names one registered environment."""

    env_id: Int64


class LeaseRequest(BaseModel):
    """Body of the leased ``POST /batch`` (every field optional)."""

    model_config = _WIRE_CONFIG

    lease_seconds: float = Field(default=300.0, gt=0, le=86_400)
    wait_seconds: float = Field(default=0.0, ge=0, le=30)
    client_id: Optional[str] = Field(default=None, max_length=256)


class EnvRecord(BaseModel):
    """The server's bookkeeping for one registered environment process."""

    registered_id: int
    desired_name: str
    real_name: str
    max_context_len: int
    weight: float
    group_size: int
    min_batch_allocation: Optional[float] = None
    connected: bool = True
    last_update: float
    env_key: Optional[str] = None


class RunConfig(BaseModel):
    """The trainer's registration as the server keeps it."""

    wandb_group: Optional[str]
    wandb_project: Optional[str]
    batch_size: int
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    num_steps: int
    starting_step: int

    @classmethod
    def from_registration(cls, registration: Registration) -> "RunConfig":
        return cls(**registration.model_dump(exclude={"replace"}))
