"""The HTML report shows rollouts with their rewards and never runs model output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from atroposlib.frontend.jsonl2html import create_html_for_group, generate_html, get_score_class


def test_score_classes() -> None:
    assert [get_score_class(s) for s in (0.5, -1, 0, "x")] == ["reward-positive", "reward-negative", "reward-zero", ""]


def test_group_block_and_page(tmp_path: Path) -> None:
    data = tmp_path / "run.jsonl"
    groups = [
        {"messages": [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "plain"], "scores": [1.0, 0]},
        {"tokens": [[1]]},
        {"messages": [], "scores": []},
    ]
    data.write_text("\n".join(json.dumps(g) for g in groups) + "\n\n")
    page = generate_html(data).read_text()
    assert "<title>Rendered Messages - run.jsonl</title>" in page
    assert '<div class="item reward-positive" id="group-0-item-0">' in page
    assert "<strong>User</strong>: 2+2?" in page and "<strong>Reward:</strong> 0" in page
    assert page.count("<details>") == 1


def test_model_output_is_escaped(tmp_path: Path) -> None:
    evil = '<script>alert(1)</script><img src=x onerror="alert(2)"><a href="javascript:alert(3)">x</a>'
    block = create_html_for_group({"messages": [[{"role": "assistant", "content": evil}]], "scores": [1]}, 0)
    assert not re.search(r"<(script|img|a)\b", block), block
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in block


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "No data to display" in generate_html(empty).read_text()
    with pytest.raises(FileNotFoundError):
        generate_html(tmp_path / "missing.jsonl")


def test_command_line_help_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from atroposlib.frontend.jsonl2html import main

    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0 and "usage: atropos-jsonl2html" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stopped:
        main([])
    assert stopped.value.code == 2
    assert main([str(tmp_path / "missing.jsonl")]) == 1
    assert "no JSONL file at" in capsys.readouterr().err
    data = tmp_path / "run.jsonl"
    data.write_text(json.dumps({"messages": ["hi"], "scores": [1]}) + "\n")
    assert main([str(data), str(tmp_path / "page.html")]) == 0 and (tmp_path / "page.html").exists()
