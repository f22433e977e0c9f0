"""The JSON shapes exchanged with the trajectory API, defined once for server and clients.

A *group* (`ScoredData`) is the unit an environment submits: ``len(tokens)`` sequences
scored together. The server stores each accepted group as an *item*: a JSON object with
exactly the fourteen keys of `ITEM_KEYS`, absent optionals being ``null``.

Non-finite floats (NaN, Infinity) are refused everywhere: JSON cannot carry them
portably, and one of them in a stored group would break every batch it lands in.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

# Integers the server keeps as numbers: within 2**53, where every JSON reader (and a
# float comparison of the bounds) agrees on their value, and SQLite's 64 bits hold them.
JSON_SAFE_INT = 2**53 - 1
SafeInt = Annotated[int, Field(ge=-JSON_SAFE_INT, le=JSON_SAFE_INT)]
# Token ids `--validation` accepts are below this: the int32 range trainers index embeddings with.
TOKEN_ID_LIMIT = 2**31

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

# Strict types: no strings or booleans where numbers are expected (``{"env_id": false}``).
# Whole-number floats (``2.0``) are integers in JSON Schema; `atroposlib.api.validation.parse_json`
# accepts them.
_WIRE_CONFIG = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

# The documented shape of `ScoredData.messages`: every message carries `role` and `content`.
_MESSAGES_SCHEMA = WithJsonSchema({
    "anyOf": [
        {"type": "array", "items": {"type": "array", "items": {"type": "object", "required": ["role", "content"]}}},
        {"type": "null"},
    ],
})


class ScoredData(BaseModel):
    """One scored group as submitted to ``/scored_data`` (and stored as an item)."""

    model_config = _WIRE_CONFIG

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: Optional[list[list[float]]] = None
    ref_logprobs: Optional[list[list[float]]] = None
    messages: Annotated[Optional[list[list[dict[str, Any]]]], _MESSAGES_SCHEMA] = None
    generation_params: Optional[dict[str, Any]] = None
    inference_logprobs: Optional[list[list[float]]] = None
    overrides: Optional[list[dict[str, Any]]] = None
    group_overrides: Optional[dict[str, Any]] = None
    images: Optional[Any] = None
    env_id: Optional[SafeInt] = None
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

    model_config = _WIRE_CONFIG

    wandb_group: Optional[str]
    wandb_project: Optional[str]
    batch_size: int = Field(ge=1, le=JSON_SAFE_INT, description="Sequences per batch (a run of batches of 0 never starts).")
    max_token_len: SafeInt
    checkpoint_dir: str
    save_checkpoint_interval: SafeInt
    starting_step: SafeInt
    num_steps: SafeInt
    max_staleness: Optional[int] = Field(
        default=None,
        ge=0,
        le=JSON_SAFE_INT,
        description="Most trainer steps a group's sampling weights may lag the step it is trained "
        "at; staler groups are dropped instead of served. Null: no bound.",
    )
    replace: bool = Field(
        default=False,
        description="Replace the stored run configuration instead of keeping the first one.",
    )


class RegisterEnv(BaseModel):
    """An environment process announcing itself, body of ``POST /register-env``."""

    model_config = _WIRE_CONFIG

    max_token_length: SafeInt
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

    model_config = _WIRE_CONFIG

    env_id: SafeInt


class LeaseRequest(BaseModel):
    """Body of the leased ``POST /batch`` (every field optional)."""

    model_config = _WIRE_CONFIG

    lease_seconds: float = Field(default=300.0, gt=0, le=86_400)
    wait_seconds: float = Field(default=0.0, ge=0, le=30)
    client_id: Optional[str] = Field(default=None, max_length=256)
    trains: bool = Field(default=True, description="false for a consumer that does not train on the batch (a "
                                                   "dataset tool): its ack does not advance the training step")


class ErrorInfo(BaseModel):
    """What went wrong: a stable machine-readable `code`, a message naming the problem."""

    code: str
    message: str
    details: dict[str, Any]


class ErrorResponse(BaseModel):
    """Body of every error the server reports itself (422s also carry FastAPI's `detail`)."""

    status: Literal["error"]
    error: ErrorInfo
    detail: Optional[list[dict[str, Any]]] = Field(
        default=None, description="FastAPI-style validation problems (422 only)."
    )


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


# Settings a registration may leave null to accept whatever the stored run has: clients
# that predate them (Atropos's) send null or nothing, and must still join a run that set one.
ACCEPTS_STORED_WHEN_NULL: tuple[str, ...] = ("max_staleness",)


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
    # Runs stored before the field existed load with no bound.
    max_staleness: Optional[int] = None

    @classmethod
    def from_registration(cls, registration: Registration) -> "RunConfig":
        return cls(**registration.model_dump(exclude={"replace"}))

    def differences(self, requested: "RunConfig") -> dict[str, dict[str, Any]]:
        """Settings `requested` gives other values than this stored run, as
        ``{name: {"stored": ..., "requested": ...}}``; a null among
        `ACCEPTS_STORED_WHEN_NULL` asks for nothing and never differs."""
        stored = self.model_dump()
        return {
            name: {"stored": stored[name], "requested": value}
            for name, value in requested.model_dump().items()
            if stored[name] != value and not (value is None and name in ACCEPTS_STORED_WHEN_NULL)
        }
