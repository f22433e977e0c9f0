"""Fixtures of the trainer's tests: a tiny model folder, a `run-api` that lets environments
register before the trainer's first batch request, and the trainer's bundled vLLM server on
the real model (float32), started once for the session."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from example_trainer.vllm_manager import TrainerVLLM
from tests.example_trainer.tiny_model import build_tiny_model
from tests.helpers import ApiProcess
from tests.real_engine import (
    BundledServerStart,
    EarlyEngines,
    bundled_server,
    start_timeout,
    start_with_one_retry,
    to_terminal,
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), tokenizer_dir)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiProcess]:
    with ApiProcess(tmp_path / "state", "--no-registration-gate") as server:
        yield server


@pytest.fixture(scope="session")
def served(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainerVLLM]:
    manager = EarlyEngines.take_bundled(real_model_dir) or bundled_server(tmp_path_factory.mktemp("vllm") / "vllm.log")
    with manager:
        start_with_one_retry(lambda: BundledServerStart(manager, str(real_model_dir)), start_timeout(), to_terminal)
        yield manager
