"""The code examples in the documentation run as written."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import httpx

from tests.conftest import env_registration, group
from tests.helpers import ApiProcess

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lease_loop_example_trains_on_every_batch(tmp_path: Path) -> None:
    example = _load("lease_loop")
    with ApiProcess(tmp_path / "state") as api:
        result: list[int] = []
        trainer = threading.Thread(target=lambda: result.append(example.run_trainer(api.url, steps=3)))
        trainer.start()
        while not httpx.get(api.url + "/health").json()["started"]:
            pass
        env = httpx.post(api.url + "/register-env", json=env_registration("demo", 8)).json()
        for score in range(6):
            httpx.post(api.url + "/scored_data", json=group(8, env_id=env["env_id"], score=score)).raise_for_status()
        trainer.join(60)
        assert result == [3]


def test_readme_shows_the_example_verbatim() -> None:
    example = (ROOT / "docs" / "examples" / "lease_loop.py").read_text()
    body = example.split('"""', 2)[2].strip()
    assert body in (ROOT / "README.md").read_text()
