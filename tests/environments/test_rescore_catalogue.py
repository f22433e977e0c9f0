"""``rescore`` on the catalogue's verifiable environments: groups written with their items (as
``process`` writes them, against the check mode's stand-in answers, made env-specific where the
stand-in never writes a right one) re-score to exactly the scores they were written with, the
reward being unchanged. `CANNOT_RESCORE` lists the environments that say why they cannot, and
the test holds them to their one line.

Each environment runs from its catalogue row's offline command (data files, settings), in this
process, in a temporary working folder.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

from atroposlib.cli.check_env import environment_class
from atroposlib.envs.rescore_hooks import RESCORE_FACTS_FIELD, SAVED_ITEM_FIELD
from atroposlib.envs.cli import resolve_settings
from atroposlib.envs.runner import build_env, main
from atroposlib.envs.server_handling.sampling_record import recording
from atroposlib.envs.server_handling.stand_in import StandInServer
from tests.environments.test_check_catalogue import CATALOGUE, SERVER_FLAGS

ROOT = Path(__file__).resolve().parents[2]


def _reversal(item: Any) -> list[str]:
    expected = item["expected"]
    return [f"<think>ok</think><reversed_text>{expected}</reversed_text>", "<think>ok</think><reversed_text>x"
            "</reversed_text>", f"<reversed_text>{expected}</reversed_text>",
            f"<think>ok</think>\n<reversed_text>\n  {expected}\n</reversed_text>"]


def _letters(item: Any) -> list[str]:
    _, counts, _, letters, _ = item
    right = str(counts[letters[0]]) if len(letters) == 1 else json.dumps({k: counts[k] for k in letters})
    wrong = "999" if len(letters) == 1 else json.dumps({k: counts[k] + 1 for k in letters})
    return [f"<think>counting</think><answer>{right}</answer>", f"<think>counting</think><answer>{wrong}</answer>",
            f"<answer>{right}</answer>", f"<think>counting</think><answer>{right}</answer>"]


def _fundamentals(item: Any) -> list[str]:
    metric, direction = item["fundamental_metric"], item["answer"]
    other = next(d for d in ("raised", "reduced", "maintained") if d != direction)
    say = "<think>ok</think>\nThe {} will be: {} and the magnitude will be: {}%"
    return [say.format(metric, direction, str(item["magnitude"]).rstrip("%")), say.format(metric, other, 5),
            say.format(metric, direction, 95), f"no thinking. The {metric} will be: {direction}"]


def _tool_calls(item: Any) -> list[str]:
    gold = item[1]
    return [gold, "The answer is that you should ask someone else about it.", gold, "<tool_call>{}</tool_call>"]


# path -> answers for an item (None: the stand-in's own, which are right and wrong ones already)
RESCORABLE: dict[str, Callable[[Any], list[str]] | None] = {
    "small_sums_env.py": None,
    "arithmetic_env.py": None,
    "gsm8k_server.py": None,
    "mcqa_thinking_env.py": None,
    "text_reversal_environment.py": _reversal,
    "letter_counting_environment/letter_counting_environment.py": _letters,
    "fundamental_prediction_environment.py": _fundamentals,
    "tool_calling_server.py": _tool_calls,
    "brevity_env.py": None,
    "math_server.py": None,
}
# path -> the end of the one line rescore exits 1 with
CANNOT_RESCORE: dict[str, str] = {
    "rlaif_server.py": "its score is a judge model's preference between two rollouts (inference)",
}
COMMANDS = dict(CATALOGUE)


def process_flags(command: str) -> tuple[Path, list[str]]:
    """(the env file, the offline command's flags, paths made absolute, server flags left out)."""
    for server_flags in SERVER_FLAGS:
        command = command.replace(server_flags, "")
    words = shlex.split(command)
    script, _mode, *flags = words[words.index("python") + 1:]
    return ROOT / script, [str(ROOT / w) if w.startswith("environments/") else w for w in flags]


def write_groups(env_cls: Any, flags: list[str], out: Path, answers: Callable[[Any], list[str]] | None,
                 tokenizer_dir: Path, wanted: int = 3) -> list[dict[str, Any]]:
    """Groups of `env_cls` written as process writes them (items saved), answered by the stand-in."""
    settings = resolve_settings(env_cls, ["process", *flags, "--env.tokenizer_name", str(tokenizer_dir),
                                          "--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out)])
    env = build_env(env_cls, replace(settings, manager=settings.manager.model_copy(update={"testing": True})))
    stand_in = StandInServer(env.tokenizer)
    env.server.servers = [stand_in]

    async def run() -> None:
        written = 0
        try:
            await env.setup()
            for _ in range(wanted * 4):
                if written >= wanted:
                    break
                item = await env.get_next_item()
                stand_in.start_item(item)
                if answers is not None:
                    stand_in.answers = answers(item)
                with recording():
                    result, _ = await env.collect_trajectories(item)
                    if result:
                        result = await env.postprocess_histories(result)
                        kept = await env.handle_send_to_api(result, item, do_send_to_api=False,
                                                            abort_on_any_max_length_exceeded=False)
                        written += len(kept)
                await env.cleanup()
        finally:
            env.close_jsonl_writer()
            await env.server.close()

    asyncio.run(run())
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def rescore(env_cls: Any, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, list[str], str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(env_cls, ["rescore", *flags])
    captured = capsys.readouterr()
    return ended.value.code, captured.out.splitlines(), captured.err


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")


def catalogue_env(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str], Path]:
    """The catalogue row's environment class, its offline flags, and where its groups go (run in `tmp_path`)."""
    monkeypatch.chdir(tmp_path)
    script, flags = process_flags(COMMANDS[path])
    monkeypatch.setattr(sys, "path", sys.path[:])
    return environment_class(script), flags, tmp_path / "groups.jsonl"


@pytest.mark.parametrize("path", sorted(RESCORABLE))
def test_rescoring_with_the_same_reward_gives_the_same_scores(path: str, tokenizer_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    env_cls, flags, saved = catalogue_env(path, tmp_path, monkeypatch)
    groups = write_groups(env_cls, flags, saved, RESCORABLE[path], tokenizer_dir)
    assert groups, f"{path} wrote no group"
    assert all(SAVED_ITEM_FIELD in group for group in groups)
    assert any(len(set(group["scores"])) > 1 for group in groups), [group["scores"] for group in groups]
    status, lines, err = rescore(env_cls, capsys, *flags, "--input", str(saved), "--output", str(tmp_path / "o.jsonl"),
                                 "--env.tokenizer_name", str(tokenizer_dir))
    assert status == 0, err[-2000:]
    rollouts = sum(len(group["scores"]) for group in groups)
    assert lines[0] == (f"read {len(groups)} groups ({rollouts} rollouts) from {saved}; re-scored {len(groups)} "
                        f"with {env_cls.__name__}"), "\n".join(lines)
    assert f"scores changed: 0 of {rollouts} rollouts, in 0 of {len(groups)} groups" in lines, "\n".join(lines)
    written = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [row["scores"] for row in written] == [group["scores"] for group in groups]


def test_mcqa_rescores_by_the_finish_reasons_saved_with_the_group(tokenizer_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """mcqa_thinking saves each rollout's finish reason in its JSONL row (the group handed to the
    API does not carry it: tests/envs/test_rescore.py); a rollout cut off scores -1 when re-scored,
    and a group saved without the finish reasons cannot be."""
    monkeypatch.chdir(tmp_path)
    script, flags = process_flags(COMMANDS["mcqa_thinking_env.py"])
    monkeypatch.setattr(sys, "path", sys.path[:])
    env_cls = environment_class(script)
    groups = write_groups(env_cls, flags, tmp_path / "g.jsonl", None, tokenizer_dir, wanted=1)
    group = groups[0]
    assert group[RESCORE_FACTS_FIELD] == [{"finish_reason": "stop"}] * len(group["scores"])
    assert 1.0 in group["scores"]
    env = env_cls.__new__(env_cls)  # rescore_group needs neither a server nor a tokenizer here
    assert asyncio.run(env.rescore_group(group, group[SAVED_ITEM_FIELD])) == group["scores"]
    cut_off = {**group, RESCORE_FACTS_FIELD: [{"finish_reason": "length"}] * len(group["scores"])}
    assert asyncio.run(env.rescore_group(cut_off, group[SAVED_ITEM_FIELD])) == [-1.0] * len(group["scores"])
    with pytest.raises(ValueError, match="saved without each rollout's finish_reason"):
        asyncio.run(env.rescore_group({k: v for k, v in group.items() if k != RESCORE_FACTS_FIELD},
                                      group[SAVED_ITEM_FIELD]))


@pytest.mark.parametrize("path", sorted(CANNOT_RESCORE))
def test_an_environment_that_cannot_rescore_says_why(path: str, tokenizer_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    env_cls, flags, saved = catalogue_env(path, tmp_path, monkeypatch)
    saved.write_text(json.dumps({"tokens": [[1]], "masks": [[1]], "scores": [1.0], SAVED_ITEM_FIELD: {}}) + "\n")
    status, lines, err = rescore(env_cls, capsys, *flags, "--input", str(saved), "--env.tokenizer_name",
                                 str(tokenizer_dir))
    assert status == 1 and not lines
    assert err.strip().endswith(f"{env_cls.__name__} cannot re-score saved groups: {CANNOT_RESCORE[path]}"), err
