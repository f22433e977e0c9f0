"""Running an environment file in ``process`` mode inside the test process, as its command line would.

``python environments/<file>.py process ...`` is what a user types; importing transformers
for every such child process costs several seconds on a slow CPU, so the tests run the same
command line in this process (`runpy`, ``__name__ == "__main__"``, `sys.argv` set) and read the
groups it wrote. `ROOT` is the repository: environment files import ``environments.*`` from it.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENTS = ROOT / "environments"


def run_cli(script: str | Path, mode: str, *flags: str) -> None:
    """``python environments/SCRIPT MODE FLAGS...``, in this process; SystemExit(0) is success."""
    path = Path(script) if Path(script).is_absolute() else ENVIRONMENTS / script
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(path), mode, *flags]
    sys.path[:0] = [str(path.parent), str(ROOT)]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as ended:
        if ended.code not in (None, 0):
            raise AssertionError(f"{path.name} {mode} exited with {ended.code}") from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def process_groups(script: str | Path, tmp_path: Path, inference_url: str, tokenizer_dir: Path, *flags: str,
                   steps: int = 2, group_size: Optional[int] = None, server_type: str = "openai",
                   model_name: str = "scripted") -> list[dict[str, Any]]:
    """Run `script` in process mode for `steps` groups against `inference_url`; the groups it wrote."""
    out = tmp_path / f"{Path(script).stem}_groups.jsonl"
    common = [
        "--env.tokenizer_name", str(tokenizer_dir), "--openai.base_url", f"{inference_url}/v1",
        "--openai.model_name", model_name, "--openai.api_key", "x", "--openai.server_type", server_type,
        "--openai.tokenizer_name", str(tokenizer_dir),
        "--env.use_wandb", "false", "--env.total_steps", str(steps), "--env.data_path_to_save_groups", str(out),
        "--env.spool_dir", str(tmp_path / "spool"),
    ]
    if group_size is not None:
        common += ["--env.group_size", str(group_size)]
    run_cli(script, "process", *common, *flags)
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment tests never reach a hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
