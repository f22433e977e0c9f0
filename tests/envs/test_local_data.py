"""Local dataset files stand in for hub datasets, in every format the loader reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atroposlib.envs.local_data import load_rows, read_local_rows

ROWS = [{"question": "What is 2 + 2?", "answer": "4"}, {"question": "3 x 3?", "answer": "9"}]


def test_jsonl_json_and_csv_files_give_the_same_rows(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    (tmp_path / "d.csv").write_text("question,answer\nWhat is 2 + 2?,4\n3 x 3?,9\n")
    for name in ("d.jsonl", "d.json"):
        assert read_local_rows(tmp_path / name) == ROWS
    assert [{k: str(v) for k, v in row.items()} for row in read_local_rows(tmp_path / "d.csv")] == ROWS
    assert load_rows("not/on-the-hub", split="test", local_file=str(tmp_path / "d.jsonl")) == ROWS


def test_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no dataset file at"):
        read_local_rows(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl is not JSON Lines"):
        read_local_rows(tmp_path / "bad.jsonl")
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(ValueError, match="use a .jsonl"):
        read_local_rows(tmp_path / "data.txt")
