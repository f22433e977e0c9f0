"""Evaluation helpers: the ``metrics.json`` / ``samples.jsonl`` layout, pass@k, `EvalBase`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Optional

from atroposlib.utils.display import display_metrics_table

log = logging.getLogger("atroposlib.envs")


def pass_at_k(m: int, c: int, k: int) -> float:
    """Unbiased pass@k from `m` samples of which `c` are correct."""
    if m - c < k:
        return 1.0
    product = 1.0
    for i in range(m - c + 1, m + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def evaluate_log(
    metrics: dict[str, Any],
    eval_dir: Optional[str] = None,
    task_name: Optional[str] = None,
    model_name: Optional[str] = None,
    start_time: Optional[float] = None,
    end_time: Optional[float] = None,
    generation_parameters: Optional[dict[str, Any]] = None,
    samples: Optional[list[dict[str, Any]]] = None,
    verbose: bool = True,
) -> None:
    """Write ``metrics.json`` (and ``samples.jsonl``) to `eval_dir` in the lighteval layout."""
    if eval_dir is None:
        log.warning("no evaluation directory set: evaluation results are not saved")
        return
    now = time.time()
    start, end = start_time or now, end_time or now
    task = task_name or "eval"
    if verbose:
        display_metrics_table(task, metrics, start, end)
    folder = Path(eval_dir)
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "config_general": {
            "model_name": model_name,
            "total_evaluation_time_seconds": str(end - start),
            "generation_parameters": generation_parameters or {},
        },
        "results": {f"atropos|{task}|0": metrics, "all": metrics},
    }
    (folder / "metrics.json").write_text(json.dumps(document, indent=2))
    print(f"evaluation metrics saved to {folder / 'metrics.json'}")
    if samples:
        with open(folder / "samples.jsonl", "w") as handle:
            for sample in samples:
                handle.write(json.dumps(sample) + "\n")
        print(f"evaluation samples saved to {folder / 'samples.jsonl'}")


class EvalBase(ABC):
    """A standalone evaluation: data, a per-item scorer, and averaged metrics."""

    def __init__(self, pass_at_n: int = 1, pass_at_n_samples: int = 1, **kwargs: Any) -> None:
        self.pass_at_n = pass_at_n
        self.pass_at_n_samples = pass_at_n_samples
        for key, value in kwargs.items():
            setattr(self, key, value)
        self.data = self.setup_data()

    @abstractmethod
    def setup_data(self) -> list[Any]: ...

    @abstractmethod
    async def run_item(self, server: Any, data_item: Any) -> tuple[dict[str, float], dict[str, Any]]: ...

    def get_generation_params(self) -> dict[str, Any]:
        return {
            "temperature": getattr(self, "temperature", None) or 0.0,
            "n": max(self.pass_at_n_samples, self.pass_at_n),
            "top_p": getattr(self, "top_p", None) or 1.0,
            "max_tokens": getattr(self, "max_tokens", None) or -1,
        }

    async def chat_completion(self, server: Any, messages: list[dict[str, Any]]) -> Any:
        params = {k: v for k, v in self.get_generation_params().items() if not (k == "max_tokens" and v == -1)}
        return await server.chat_completion(messages=messages, **params)

    async def __call__(self, server_manager: Any) -> dict[str, float]:
        start = time.time()
        results = await asyncio.gather(*(self.run_item(server_manager, item) for item in self.data))
        metrics: dict[str, float] = {}
        for key in {k for item_metrics, _ in results for k in item_metrics}:
            values = [m[key] for m, _ in results if key in m]
            metrics[key] = sum(values) / len(values)
        task = f"{type(self).__name__}@{self.pass_at_n}"
        if self.pass_at_n_samples != self.pass_at_n:
            task += f":{self.pass_at_n_samples}"
        evaluate_log(
            metrics, eval_dir=getattr(self, "eval_dir", None), task_name=task,
            model_name=server_manager.servers[0].config.model_name, start_time=start, end_time=time.time(),
            generation_parameters=self.get_generation_params(), samples=[s for _, s in results],
            verbose=getattr(self, "verbose", False),
        )
        return metrics


async def eval_runner(eval_env: EvalBase) -> dict[str, float]:
    """Run `eval_env` against ``--server-url`` / ``--model-name`` from the command line."""
    from atroposlib.envs.server_handling.configs import APIServerConfig
    from atroposlib.envs.server_handling.server_manager import ServerManager

    parser = argparse.ArgumentParser()
    parser.add_argument("--server-url", default="http://localhost:8000")
    parser.add_argument("--model-name", default="default")
    args, _ = parser.parse_known_args()
    manager = ServerManager(
        APIServerConfig(api_key="dummy", base_url=args.server_url, model_name=args.model_name, health_check=False)
    )
    return await eval_env(manager)
