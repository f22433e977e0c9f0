"""Fixtures of the trainer's loop tests: a tiny model folder and a `run-api` that lets
environments register before the trainer's first batch request."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.example_trainer.tiny_model import build_tiny_model
from tests.helpers import ApiProcess


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), tokenizer_dir)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiProcess]:
    with ApiProcess(tmp_path / "state", "--no-registration-gate") as server:
        yield server
