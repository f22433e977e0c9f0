"""``check`` on every environment of the catalogue (environments/README.md's tables), offline.

Each row's offline command becomes a check command: the mode word becomes ``check``, the
server flags (``$SERVER``, TextWorld's ``--config tw.yaml``) are left out so that the built-in
stand-in answers, the test tokenizer is given, and 2 groups are checked. The command runs in
this process (`runpy`, as `tests.environments.harness` does), in a temporary working folder.

Most environments pass every check. The others are listed in `KNOWN_FAILURES` with each failing
check and why it fails, and the test holds them to exactly those lines: a new failure, or a
listed one that starts passing, fails the test. `NOT_CHECKABLE_HERE` lists what cannot run
offline at all, with its reason and the one line it stops with.
"""

from __future__ import annotations

import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from tests.environments.test_catalogue_readme import README, _path_of, _readme, _tables

ROOT = Path(__file__).resolve().parents[2]
OFFLINE_CELL = 6
COMMAND = re.compile(r"`([^`]*python environments/[^`]+)`")
# Left out so that the stand-in answers: $SERVER, and the YAML file of TextWorld's four servers; the
# test tokenizer replaces $TOKENIZER (a later --env.tokenizer_name wins).
SERVER_FLAGS = ("$SERVER", "--config tw.yaml", "--env.tokenizer_name $TOKENIZER")

NO_RIGHT_ANSWER = ("the stand-in never writes a right answer for this task ({}), so every group scores alike and "
                   "the environment drops it itself, as it drops groups without a learning signal")
NO_MESSAGES = "its groups carry no messages (the viewers show decoded tokens instead)"
EVALUATION_ONLY = {"groups collected": "evaluation-only: collect_trajectories returns no group"}
PREFILL = ("it trains the <think> prefill it sends as part of the prompt: tokens the model was given, "
           "not sampled")

KNOWN_FAILURES: dict[str, dict[str, str]] = {
    "rlaif_server.py": {"scores vary within groups": "its reward is the same model's pairwise judgement; the "
                        "stand-in's answers to the judge prompts hold no \\boxed{A}/\\boxed{B} verdict"},
    "tool_calling_server.py": {"groups collected": NO_RIGHT_ANSWER.format("tool calls matching the gold calls")},
    "tool_use_multiturn_server.py": {"groups collected": NO_RIGHT_ANSWER.format("a tool call per turn")},
    "fundamental_prediction_environment.py": {"groups collected": NO_RIGHT_ANSWER.format(
        "a direction and a magnitude")},
    "text_reversal_environment.py": {"groups collected": NO_RIGHT_ANSWER.format("the reversed text")},
    "letter_counting_environment/letter_counting_environment.py": {"groups collected": NO_RIGHT_ANSWER.format(
        "letter counts in its answer format")},
    "answer_format_environment/answer_format_environment.py": {"groups collected": NO_RIGHT_ANSWER.format(
        "one of 170 required formats")},
    "pydantic_schema_following_environment/pydantic_schema_following_environment.py": {
        "groups collected": NO_RIGHT_ANSWER.format("a document the schema accepts")},
    "infinimath/infinimath_env.py": {"prompt masked, completion trained": PREFILL},
    "code_execution_server/coding_server.py": {
        "scores vary within groups": "the stand-in writes no program that passes the tests: every answer scores -1",
        "messages present and renderable": NO_MESSAGES},
    "dataset_environment/dataset_env.py": {"messages present and renderable": NO_MESSAGES},
    "game_environments/gymnasium/gym_taxi.py": {
        "scores vary within groups": "the stand-in's answers never deliver the passenger: every episode scores -1"},
    "game_environments/gymnasium/blackjack/blackjack_env_no_thinking.py": {
        "scores vary within groups": "the stand-in makes no take_action tool call: every rollout scores -1",
        "messages present and renderable": NO_MESSAGES},
    "game_environments/gymnasium/blackjack/blackjack_env_thinking.py": {"prompt masked, completion trained": PREFILL},
    "game_environments/textworld_env/textworld_env.py": {
        "scores vary within groups": "the stand-in's commands never score in the game: every episode scores 0",
        "messages present and renderable": "its groups carry messages only with include_messages on"},
    "multimodal_dpo/ocr_vqa.py": {"messages present and renderable": NO_MESSAGES},
    "multimodal_dpo/clevr_cogen_a_train.py": {"messages present and renderable": NO_MESSAGES},
    "multimodal_dpo/clevr_complex.py": {"messages present and renderable": NO_MESSAGES},
}
# Environments whose default seed is drawn at random: with one, the stand-in now and then meets
# a format by chance and a group is kept; a fixed seed makes the check the same every run.
SEEDED = {"answer_format_environment/answer_format_environment.py": ["--env.seed", "20"]}
NOT_CHECKABLE_HERE: dict[str, tuple[str, str]] = {
    "verifiers_server.py": ("it runs a verifiers environment, and none ships: one must be installed first "
                            "(prime env install owner/name)", "verifiers environment 'owner/name' is not installed"),
}


def catalogue() -> list[tuple[str, str]]:
    """(path under environments/, its offline command) for every row."""
    catalogue_text, _ = _readme()
    return [(_path_of(row[0]), COMMAND.findall(row[OFFLINE_CELL])[0]) for row in _tables(catalogue_text, "environment")]


def check_command(command: str, tokenizer_dir: Path) -> list[str]:
    """The offline command as a check command's argv, paths made absolute (it runs elsewhere)."""
    for server_flags in SERVER_FLAGS:
        command = command.replace(server_flags, "")
    words = shlex.split(command)
    script, _mode, *flags = words[words.index("python") + 1:]
    flags = [str(ROOT / word) if word.startswith("environments/") else word for word in flags]
    return [str(ROOT / script), "check", *flags, "--env.tokenizer_name", str(tokenizer_dir), "--groups", "2"]


def run_check(argv: list[str]) -> int:
    """``python ARGV`` in this process; its exit status."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = argv
    sys.path[:0] = [str(Path(argv[0]).parent), str(ROOT)]
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as ended:
        return ended.code if isinstance(ended.code, int) else 0
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def expected_failures(path: str) -> dict[str, str]:
    if path.startswith("eval_environments/"):
        return EVALUATION_ONLY
    return KNOWN_FAILURES.get(path, {})


CATALOGUE = catalogue()


def test_every_listed_environment_is_in_the_catalogue() -> None:
    paths = {path for path, _ in CATALOGUE}
    assert len(paths) >= 30, f"{README} lists only {len(paths)} environments"
    unknown = (set(KNOWN_FAILURES) | set(NOT_CHECKABLE_HERE)) - paths
    assert not unknown, f"listed here but not in the catalogue: {sorted(unknown)}"


@pytest.mark.parametrize("path, command", CATALOGUE, ids=[path for path, _ in CATALOGUE])
def test_check_on_the_catalogue_environment(path: str, command: str, tokenizer_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    if path.startswith("game_environments/textworld_env/"):
        pytest.importorskip("textworld")  # the games extra, installed where the suite runs in full
    monkeypatch.chdir(tmp_path)
    status = run_check(check_command(command, tokenizer_dir) + SEEDED.get(path, []))
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    if path in NOT_CHECKABLE_HERE:
        _, message = NOT_CHECKABLE_HERE[path]
        assert status == 1 and message in captured.err, captured.err[-2000:]
        return
    report = "\n".join(lines) + "\n--- stderr (end)\n" + captured.err[-2000:]
    assert lines and lines[-1].endswith(("checks passed", "checks failed")), report
    failures = {line[len("FAIL  "):].split(":")[0] for line in lines if line.startswith("FAIL  ")}
    assert failures == set(expected_failures(path)), report
    assert status == (1 if failures else 0), report
