"""Loading an environment's dataset: from the Hugging Face hub as Atropos does, or from a local file.

Every dataset environment here takes ``--env.train_file`` / ``--env.test_file`` (or the
fields its docstring names): a local file in the hub dataset's own column layout (JSON
Lines, JSON, CSV or Parquet, by suffix), used instead of the hub so that it runs with no
internet. Without one, the hub dataset is loaded exactly as Atropos's environment loads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

LOCAL_FORMATS = {".csv": "csv", ".parquet": "parquet", ".json": "json"}


def read_local_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a local dataset file; `FileNotFoundError` / `ValueError` name the file."""
    source = Path(path).expanduser()
    if not source.is_file():
        raise FileNotFoundError(f"no dataset file at {source}")
    if source.suffix == ".jsonl":
        with source.open(encoding="utf-8") as lines:
            try:
                return [json.loads(line) for line in lines if line.strip()]
            except json.JSONDecodeError as err:
                raise ValueError(f"{source} is not JSON Lines: {err}") from None
    builder = LOCAL_FORMATS.get(source.suffix)
    if builder is None:
        raise ValueError(f"{source}: use a .jsonl, .json, .csv or .parquet file")
    from datasets import load_dataset

    return list(load_dataset(builder, data_files=str(source), split="train"))


def load_rows(hub_name: str, config: Optional[str] = None, split: str = "train",
              local_file: Optional[str] = None, **hub_kwargs: Any) -> list[dict[str, Any]]:
    """A split's rows: `local_file` when given, else ``load_dataset(hub_name, config, split=split)``."""
    if local_file:
        return read_local_rows(local_file)
    from datasets import load_dataset

    return list(load_dataset(hub_name, config, split=split, **hub_kwargs))
