"""`made_once`: one `make` per test run, however many workers (here, processes) ask at once,
and a `make` that raised is tried again."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from tests.once_per_run import made_once


class Factory:
    """Stands in for pytest's TempPathFactory: the same base temp in every process."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base


def count_and_fill(folder: Path) -> None:
    with open(folder.parent / "makes", "a") as makes:
        makes.write("made\n")
    (folder / "result").write_text("done")


def ask(base: str) -> str:
    return (made_once(Factory(Path(base)), "shared", count_and_fill) / "result").read_text()  # type: ignore[arg-type]


def test_workers_asking_at_once_share_one_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pool = multiprocessing.get_context("fork").Pool(4)
    try:
        assert pool.map(ask, [str(tmp_path)] * 8) == ["done"] * 8
    finally:  # the workers end on their own: no SIGTERM, which a handler this process inherited could catch
        pool.close()
        pool.join()
    assert (tmp_path / "makes").read_text() == "made\n"


def test_a_make_that_raised_is_tried_again_from_an_empty_folder(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def fail(folder: Path) -> None:
        (folder / "partial").touch()
        raise RuntimeError("the launch failed")

    with pytest.raises(RuntimeError, match="the launch failed"):
        made_once(Factory(tmp_path), "shared", fail)  # type: ignore[arg-type]
    folder = made_once(Factory(tmp_path), "shared", count_and_fill)  # type: ignore[arg-type]
    assert sorted(path.name for path in folder.iterdir()) == [".made", "result"]
