"""Where local inference keeps its runtime, models and vLLM's cache: ``$ATROPOS_HOME`` or the user data dir."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def atropos_home() -> Path:
    return Path(os.environ.get("ATROPOS_HOME") or platformdirs.user_data_dir("atroposlib"))


def runtime_dir() -> Path:
    """The vLLM runtime's virtual environment."""
    return atropos_home() / "vllm-runtime"


def models_dir() -> Path:
    return atropos_home() / "models"


def vllm_cache_dir() -> Path:
    """vLLM's cache (``VLLM_CACHE_ROOT``) for the servers atroposlib starts: beside the runtime
    rather than in each user's home, so that a process with another HOME (a test, a service
    account) finds what an earlier start worked out, such as the model's class inspection
    (a ~20 s import of vLLM in a child process when missing)."""
    return atropos_home() / "vllm-cache"


DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME
