"""Where local inference keeps its runtime and models: ``$ATROPOS_HOME`` or the user data dir."""

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


DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME
