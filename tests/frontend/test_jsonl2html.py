"""The HTML report shows rollouts with their rewards and never runs model output."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from atroposlib.frontend import jsonl2html
from atroposlib.frontend.jsonl2html import create_html_for_group, generate_html, get_score_class
from tests.frontend.samples import gsm8k_groups


def write_jsonl(path: Path, groups: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(group) for group in groups) + "\n\n")
    return path


def bodies_of(page: str) -> list[str]:
    """The rollouts block of a page, one string per group."""
    block = re.search(r'<script type="text/html" id="group-bodies">(.*?)</script>', page, re.S)
    assert block, "no group-bodies block"
    return block.group(1).split(jsonl2html.BODY_END)[:-1]


def test_score_classes() -> None:
    assert [get_score_class(s) for s in (0.5, -1, 0, "x")] == ["reward-positive", "reward-negative", "reward-zero", ""]
    assert [get_score_class(s) for s in (True, None, math.nan, math.inf)] == ["", "", "", "reward-positive"]


def test_group_block_keeps_the_reference_shape_and_adds_scores() -> None:
    block = create_html_for_group({"messages": [[{"role": "user", "content": "2+2?"}], "plain", "x"],
                                   "scores": [1.0, 0, 1]}, 3)
    assert block.startswith('<details class="group" id="group-3" data-index="3" data-rollouts="3" '
                            'data-min="0.0" data-mean="0.6666666666666666" data-max="1.0" data-spread="1.0">'
                            "<summary>Group 3<span")
    assert '<div class="group-content"><div class="item reward-positive best" id="group-3-item-0">' in block
    assert '<div class="item reward-zero" id="group-3-item-1">\n    <h4>Content 1</h4>' in block
    assert '<div class="item reward-positive best" id="group-3-item-2">' in block
    assert "<strong>User</strong>: 2+2?" in block and "<strong>Reward:</strong> 0</p>" in block
    summary = re.search(r"<summary>(.*?)</summary>", block).group(1)
    text = re.sub(r"<[^>]+>", " ", summary).split()
    assert text == ["Group", "3", "3", "rollouts", "min", "0", "mean", "0.6667", "max", "1"]
    assert block.endswith("</div></div></details>")


def test_equal_scores_have_no_best_and_odd_scores_are_shown_escaped() -> None:
    flat = create_html_for_group({"messages": ["a", "b"], "scores": [0.5, 0.5]}, 0)
    assert "best" not in flat and "all equal" in flat
    odd = create_html_for_group({"messages": ["a", "b"], "scores": ["<b>pass</b>", None]}, 1)
    assert "<strong>Reward:</strong> &lt;b&gt;pass&lt;/b&gt;</p>" in odd and "<b>pass" not in odd
    assert "no numeric scores" in odd and "data-mean" not in odd


def test_a_message_opening_with_a_block_goes_under_its_role() -> None:
    block = create_html_for_group({"messages": [[{"role": "assistant", "content": "```python\nx = 1\n```"},
                                                 {"role": "user", "content": "1. one\n2. two"}]], "scores": [1]}, 0)
    assert '<p><strong>Assistant</strong>:</p>\n<pre><code class="language-python">x = 1\n</code></pre>' in block
    assert "<p><strong>User</strong>:</p>\n<ol>\n<li>one</li>" in block


def test_mismatched_lengths_warn_and_use_the_shorter(capsys: pytest.CaptureFixture[str]) -> None:
    block = create_html_for_group({"messages": ["one", "two", "three"], "scores": [0.5]}, 0)
    assert "one" in block and "two" not in block
    assert "group 0 has 3 messages and 1 scores" in capsys.readouterr().err
    assert create_html_for_group({"messages": [], "scores": []}, 1) == ""


def test_model_output_is_escaped() -> None:
    evil = ('<script>alert(1)</script><img src=x onerror="alert(2)"><a href="javascript:alert(3)">x</a>'
            "\n\n[click](javascript:alert(4)) ![pic](javascript:alert(5)) <iframe src=x></iframe><style>*{}</style>")
    block = create_html_for_group({"messages": [[{"role": "assistant", "content": evil}]], "scores": [1]}, 0)
    assert not re.search(r"<(script|img|iframe|style)\b", block), block
    assert "javascript:" not in re.sub(r"&lt;.*?&gt;", "", block).replace("alert(4)", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in block
    assert "<a>click</a>" in block


def test_page_streams_summaries_and_keeps_rollouts_inert(tmp_path: Path) -> None:
    groups = gsm8k_groups()
    groups[1]["messages"][0][2]["content"] = "record \x1e separator and </script><script>alert(1)</script>"
    data = write_jsonl(tmp_path / "run.jsonl", [groups[0], {"tokens": [[1]]}, "not an object", groups[1],
                                                {"messages": [], "scores": []}, groups[2]])
    page = generate_html(data).read_text()
    assert "<title>Rendered Messages - run.jsonl</title>" in page and "<h1>Rendered Messages - run.jsonl</h1>" in page
    rows = re.findall(r'<details class="group" id="group-(\d+)"[^>]*><summary>Group \d+<span', page)
    assert rows == ["0", "1", "2"]
    assert page.count('<div class="group-content"></div>') == 3
    bodies = bodies_of(page)
    assert len(bodies) == 3
    assert '<div class="item reward-positive best" id="group-0-item-0">' in bodies[0]
    assert "record \u241e separator and &lt;/script&gt;" in bodies[1]
    assert page.count("</script>") == 2  # the bodies block and the page's script: nothing closes early
    facts = dict(re.findall(r'<dd data-fact="([^"]+)">([^<]*)</dd>', page))
    assert facts["groups"] == "3" and facts["rollouts"] == "12"
    assert facts["mean score"] == "0.5833" and facts["groups whose scores differ"] == "1 (33%)"
    assert '<figure class="histogram">' in page
    assert not list(tmp_path.glob("*.partial"))


def test_template_placeholders_are_filled_once(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "{groups_html}{script}.jsonl", [{"messages": ["hi"], "scores": [1]}])
    page = generate_html(data, tmp_path / "out" / "page.html").read_text()
    assert "<title>Rendered Messages - {groups_html}{script}.jsonl</title>" in page
    assert not re.search(r"\{(title|style|summary_html|groups_html|group_bodies|script)\}", page.split("<title>")[0])
    assert page.count('id="groups-container"') == 1


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    page = generate_html(empty).read_text()
    assert "<p>No data to display.</p>" in page and "No groups." in page
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
    data = write_jsonl(tmp_path / "run.jsonl", [{"messages": ["hi"], "scores": [1]}])
    assert main([str(data), str(tmp_path / "page.html")]) == 0 and (tmp_path / "page.html").exists()
