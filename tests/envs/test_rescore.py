"""Rescore mode (`atroposlib.envs.rescore`): groups that small_sums wrote with ``process`` (each
row with its item) are scored again without inference. With the reward unchanged every score
stays; with a stricter reward (the reply must be the number alone) the scores, right/wrong flips,
groups that gained or lost a learning signal and the page of changed rollouts are as expected.
Rows saved without an item are counted and written unchanged; an input that is not JSONL of
groups exits 2 in one line, an environment that cannot re-score exits 1 with its reason; the
README's commands print what its output block shows."""

from __future__ import annotations

import json
import re
import runpy
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from atroposlib.envs.rescore_hooks import SAVED_ITEM_FIELD
from atroposlib.envs.runner import main
from tests.doc_blocks import doc_blocks
from tests.doc_commands import command_lines
from tests.environments.harness import process_groups
from tests.environments.scripted_inference import ScriptedInference

ROOT = Path(__file__).resolve().parents[2]
QUESTION = re.compile(r"What is (\d) \+ (\d)\?")


def _small_sums() -> Any:
    sys.path.insert(0, str(ROOT / "environments"))
    try:
        return runpy.run_path(str(ROOT / "environments" / "small_sums_env.py"))["SmallSumsEnv"]
    finally:
        sys.path.remove(str(ROOT / "environments"))


SmallSumsEnv = _small_sums()
AdditionEnv = runpy.run_path(str(ROOT / "docs" / "examples" / "minimal_env.py"))["AdditionEnv"]


class StrictSums(SmallSumsEnv):
    """The reward changed on purpose: the reply must be the number alone ("3 + 4 = 7" is wrong now)."""

    @staticmethod
    def score_reply(reply: str, item: dict) -> float:
        return 1.0 if reply.strip() == str(item["a"] + item["b"]) else 0.0


def answers(prompt: str, index: int) -> str:
    """By the sum's remainder mod 3, four answers that the strict reward treats differently:
    0: all right, two of them in a sentence (the strict reward gives the group a signal);
    1: half right, the right ones in a sentence (the strict reward takes the signal away);
    2: half right, one in a sentence (the signal stays)."""
    a, b = map(int, QUESTION.findall(prompt)[-1])
    s = a + b
    shapes = {0: [f"{s}", f"{a} + {b} = {s}"], 1: [f"{a} + {b} = {s}", f"{s + 1}"],
              2: [f"{s}", f"{s + 1}", f"The sum is {s}.", f"{s + 2}"]}[s % 3]
    return shapes[index % len(shapes)]


def rescore(env_cls: Any, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, list[str], str]:
    """``python env.py rescore FLAGS`` for `env_cls`, in this process: (exit status, stdout lines, stderr)."""
    with pytest.raises(SystemExit) as ended:
        main(env_cls, ["rescore", *flags])
    captured = capsys.readouterr()
    return ended.value.code, captured.out.splitlines(), captured.err


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture(scope="module")
def saved(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six small_sums groups of 4, written by process against the scripted server."""
    folder = tmp_path_factory.mktemp("saved")
    with ScriptedInference(answers, AutoTokenizer.from_pretrained(str(tokenizer_dir))) as server:
        groups = process_groups("small_sums_env.py", folder, server.url, tokenizer_dir, steps=6, group_size=4,
                                server_type="vllm")
    assert len(groups) == 6
    return folder / "small_sums_env_groups.jsonl"


def test_process_saves_each_groups_item_with_it(saved: Path) -> None:
    for row in read(saved):
        item = row[SAVED_ITEM_FIELD]
        assert set(item) == {"a", "b"}
        assert QUESTION.findall(row["messages"][0][0]["content"]) == [(str(item["a"]), str(item["b"]))]


def test_the_same_reward_gives_the_same_scores(saved: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "same.jsonl"
    status, lines, err = rescore(SmallSumsEnv, capsys, "--input", str(saved), "--output", str(out))
    assert status == 0, err
    assert lines[0] == f"read 6 groups (24 rollouts) from {saved}; re-scored 6 with SmallSumsEnv"
    assert "scores changed: 0 of 24 rollouts, in 0 of 6 groups" in lines
    assert "right -> wrong: 0, wrong -> right: 0 (right: a score above 0)" in lines
    before, after = read(saved), read(out)
    assert [row["scores"] for row in after] == [row["scores"] for row in before]
    assert [row["previous_scores"] for row in after] == [row["scores"] for row in before]
    assert "No score changed." in out.with_suffix(".html").read_text()


def _expected(row: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(old, new) scores of a row by the answers' script."""
    item = row[SAVED_ITEM_FIELD]
    replies = [conversation[-1]["content"] for conversation in row["messages"]]
    s = item["a"] + item["b"]
    old = [1.0 if re.findall(r"\d+", r)[-1] == str(s) else 0.0 for r in replies]
    new = [1.0 if r == str(s) else 0.0 for r in replies]
    return old, new


def test_a_stricter_reward_changes_the_scores_and_the_report_counts_them(
        saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, page = tmp_path / "strict.jsonl", tmp_path / "pages" / "strict.html"
    status, lines, err = rescore(StrictSums, capsys, "--input", str(saved), "--output", str(out), "--html", str(page))
    assert status == 0, err
    before, after = read(saved), read(out)
    expected = [_expected(row) for row in before]
    assert [row["scores"] for row in before] == [old for old, _ in expected]
    assert [row["scores"] for row in after] == [new for _, new in expected]
    assert [row["previous_scores"] for row in after] == [old for old, _ in expected]
    assert all(a[SAVED_ITEM_FIELD] == b[SAVED_ITEM_FIELD] and a["tokens"] == b["tokens"] for a, b in zip(after, before))
    pairs = [(o, n) for old, new in expected for o, n in zip(old, new)]
    changed = sum(o != n for o, n in pairs)
    assert changed > 0
    groups_changed = sum(old != new for old, new in expected)
    assert f"scores changed: {changed} of 24 rollouts, in {groups_changed} of 6 groups" in lines
    to_wrong, to_right = sum(o > 0 >= n for o, n in pairs), sum(n > 0 >= o for o, n in pairs)
    assert to_wrong == changed and to_right == 0
    assert f"right -> wrong: {to_wrong}, wrong -> right: 0 (right: a score above 0)" in lines
    alike = lambda scores: len(set(scores)) == 1  # noqa: E731
    gained = [i + 1 for i, (old, new) in enumerate(expected) if alike(old) and not alike(new)]
    lost = [i + 1 for i, (old, new) in enumerate(expected) if not alike(old) and alike(new)]
    signal = next(line for line in lines if line.startswith("groups with a learning signal"))
    assert signal == (f"groups with a learning signal (scores not all alike): {sum(not alike(o) for o, _ in expected)} "
                      f"before, {sum(not alike(n) for _, n in expected)} after; gained {len(gained)}, lost {len(lost)}")
    assert gained and lost, "the script gives both kinds of group"
    assert f"  gained: line{'s' if len(gained) > 1 else ''} {', '.join(map(str, gained))}" in lines
    assert f"  lost: line{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))}" in lines
    histogram = lines[lines.index("scores before and after:") + 1:lines.index(signal)]
    counts = {row.split()[0]: (int(row.split()[1]), int(row.split()[2])) for row in histogram[1:]}
    assert counts == {"0": (sum(o == 0 for o, _ in pairs), sum(n == 0 for _, n in pairs)),
                      "1": (sum(o == 1 for o, _ in pairs), sum(n == 1 for _, n in pairs))}
    html = page.read_text()
    for number, ((old, new), row) in enumerate(zip(expected, before), start=1):
        for index, (o, n) in enumerate(zip(old, new)):
            assert (f'id="line-{number}-rollout-{index}"' in html) == (o != n)
            if o != n:
                reply = row["messages"][index][-1]["content"]
                cell = html.split(f'id="line-{number}-rollout-{index}"')[1].split("</tr>")[0]
                assert reply in cell and "reward-positive" in cell and "reward-zero" in cell
    assert lines[-1] == f"changed rollouts side by side: {page}"
    assert f"<p>{changed} of 24 rollouts changed score, in {groups_changed} of 6 groups;" in html


def test_rows_without_an_item_are_counted_and_written_unchanged(saved: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    rows = read(saved)
    for row in rows[1:3]:
        del row[SAVED_ITEM_FIELD]
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(row) + "\n" for row in rows))
    status, lines, err = rescore(StrictSums, capsys, "--input", str(old))
    assert status == 0, err
    assert lines[0] == f"read 6 groups (24 rollouts) from {old}; re-scored 4 with StrictSums"
    assert lines[1] == ("2 groups have no saved item (lines 2, 3): written unchanged (saved before items were "
                        "kept, or the item was not JSON)")
    written = read(tmp_path / "old_rescored.jsonl")
    assert written[1:3] == rows[1:3]
    assert all("previous_scores" in row for i, row in enumerate(written) if i not in (1, 2))


@pytest.mark.parametrize("content, reason", [
    ("not json at all\n", "line 1 is not JSON"),
    ('{"tokens": [[1]], "masks": [[1]], "scores": [1.0]}\n[1, 2]\n', "line 2 is not a saved group"),
    ('{"scores": ["high"]}\n', "line 1 is not a saved group"),
    ("\n\n", "holds no groups"),
])
def test_an_input_that_is_not_jsonl_of_groups_exits_2_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, reason: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    status, lines, err = rescore(SmallSumsEnv, capsys, "--input", str(bad))
    assert status == 2 and not lines
    assert len(err.strip().splitlines()) == 1 and reason in err, err
    assert not (tmp_path / "bad_rescored.jsonl").exists()


@pytest.mark.parametrize("flags, message", [
    ([], "rescore needs --input FILE.jsonl"),
    (["--input", "nowhere.jsonl"], "--input nowhere.jsonl: no such file"),
    (["--groups", "2"], "unknown option --groups"),
])
def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str], flags: list[str], message: str) -> None:
    status, _, err = rescore(SmallSumsEnv, capsys, *flags)
    assert status == 2 and message in err, err


def test_the_output_must_not_be_the_input(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = rescore(SmallSumsEnv, capsys, "--input", str(saved), "--output", str(saved))
    assert status == 2 and "must not be the input" in err


def test_an_environment_that_cannot_rescore_says_why_in_one_line(
        saved: Path, tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, err = rescore(AdditionEnv, capsys, "--input", str(saved), "--output", str(tmp_path / "o.jsonl"),
                                 "--env.tokenizer_name", str(tokenizer_dir))
    assert status == 1 and not lines
    assert err.strip().endswith(
        ": AdditionEnv cannot re-score saved groups: it does not define rescore_group(group, item)"), err

    class Judged(AdditionEnv):
        cannot_rescore = "its score is a judge model's verdict (inference)"

    status, _, err = rescore(Judged, capsys, "--input", str(saved), "--env.tokenizer_name", str(tokenizer_dir))
    assert status == 1 and err.strip().endswith(
        "Judged cannot re-score saved groups: its score is a judge model's verdict (inference)")
    assert not (tmp_path / "o.jsonl").exists()


def test_a_rescore_group_that_fails_on_a_row_leaves_it_unchanged(saved: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    class Fussy(StrictSums):
        async def rescore_group(self, group, item):
            if item["a"] == read(saved)[0][SAVED_ITEM_FIELD]["a"]:
                raise KeyError("gold")
            return await super().rescore_group(group, item)

    status, lines, err = rescore(Fussy, capsys, "--input", str(saved), "--output", str(tmp_path / "f.jsonl"))
    assert status == 0, err
    assert "line 1: rescore_group failed, written unchanged: KeyError: 'gold'" in lines
    assert read(tmp_path / "f.jsonl")[0] == read(saved)[0]


def test_groups_without_messages_are_rescored_from_their_decoded_tokens(
        saved: Path, tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = read(saved)
    for row in rows:
        row.pop("messages")
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps(row) + "\n" for row in rows))
    status, lines, err = rescore(SmallSumsEnv, capsys, "--input", str(bare), "--env.tokenizer_name", str(tokenizer_dir))
    assert status == 0, err
    assert "scores changed: 0 of 24 rollouts, in 0 of 6 groups" in lines


def test_an_item_that_is_not_json_is_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    env = AdditionEnv.__new__(AdditionEnv)
    group = {"tokens": [[1]], "masks": [[1]], "scores": [1.0]}
    assert json.loads(env._saved_row(group, {"when": object()})) == group
    assert json.loads(env._saved_row(group, {"a": 1})) == {**group, SAVED_ITEM_FIELD: {"a": 1}}
    assert "items are not JSON" in caplog.text and "cannot be re-scored" in caplog.text
    assert SAVED_ITEM_FIELD not in group


# -- the README --------------------------------------------------------------------------------------

def test_the_readmes_rescore_commands_print_what_its_output_block_shows(
        tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The README's run: small_sums groups written by process, then the reward made strict (as the
    README describes it) and the file re-scored; its report is the README's output block."""
    commands = command_lines("README.md", "rescore-env")
    assert len(commands) == 1
    words = shlex.split(commands[0])
    assert words[:3] == ["python", "environments/small_sums_env.py", "rescore"]
    monkeypatch.chdir(tmp_path)
    source = Path(words[words.index("--input") + 1])
    source.parent.mkdir(parents=True)
    with ScriptedInference(answers, AutoTokenizer.from_pretrained(str(tokenizer_dir))) as server:
        # one group at a time: the file's line order (which the report names) is the items' order
        process_groups("small_sums_env.py", tmp_path, server.url, tokenizer_dir, "--env.process_concurrency", "1",
                       steps=8, group_size=4, server_type="vllm")
    (tmp_path / "small_sums_env_groups.jsonl").rename(source)
    capsys.readouterr()  # what process printed
    # the edit the README describes
    monkeypatch.setattr(SmallSumsEnv, "score_reply", StrictSums.__dict__["score_reply"])
    status, lines, err = rescore(SmallSumsEnv, capsys, *words[3:])
    assert status == 0, err
    blocks = doc_blocks("README.md")
    command_block = next(i for i, block in enumerate(blocks) if block.kind == "id" and block.argument == "rescore-env")
    shown = blocks[command_block + 1]
    assert shown.kind == "output"
    assert lines == shown.text.splitlines()


def test_serve_saves_item_and_facts_in_its_jsonl_and_sends_neither(tokenizer_dir: Path, tmp_path: Path) -> None:
    """What serve sends goes through handle_send_to_api: the env's own JSONL row (data_path_to_save_groups)
    gets the item and the rescore facts; the group posted to the API gets neither."""
    from atroposlib.envs.rescore_hooks import RESCORE_FACTS_FIELD
    from atroposlib.envs.server_handling.configs import ServerBaseline

    sent: list[Any] = []

    class Client:
        async def submit(self, path: str, payload: Any) -> None:
            sent.append((path, payload))

    config = AdditionEnv.env_config_cls(tokenizer_name=str(tokenizer_dir), group_size=2, use_wandb=False,
                                        data_path_to_save_groups=str(tmp_path / "served.jsonl"))
    env = AdditionEnv(config, ServerBaseline())
    env.api = Client()
    group = {"tokens": [[1, 2], [1, 3]], "masks": [[-100, 2], [-100, 3]], "scores": [1.0, -1.0],
             "messages": [[{"role": "assistant", "content": "2"}], [{"role": "assistant", "content": "3"}]],
             RESCORE_FACTS_FIELD: [{"finish_reason": "stop"}, {"finish_reason": "length"}]}
    item = {"question": "What is 1 + 1?", "answer": 2}
    import asyncio

    asyncio.run(env.handle_send_to_api(group, item))
    env.close_jsonl_writer()
    (row,) = read(tmp_path / "served.jsonl")
    assert row[SAVED_ITEM_FIELD] == item
    assert row[RESCORE_FACTS_FIELD] == [{"finish_reason": "stop"}, {"finish_reason": "length"}]
    (path, payload), = sent
    assert path == "/scored_data" and SAVED_ITEM_FIELD not in payload and RESCORE_FACTS_FIELD not in payload
    assert payload["scores"] == [1.0, -1.0]
