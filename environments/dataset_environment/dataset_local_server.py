#!/usr/bin/env python3
"""Try a dataset config by hand: a few prompts, their completions and their rewards, no API.

Reads a YAML file in the dataset launchers' layout (`dataset_env.config_from_yaml`: environment
fields, a ``dataset:`` block, ``server_configs:`` with ``${VAR}`` taken from the environment or a
``.env`` file), builds `DatasetEnv`, and for ``--items`` prompts prints the prompt, the expected
answer and the scores of one group. Exit status 0 when at least one group was scored, 1 otherwise.

    python environments/dataset_environment/dataset_local_server.py --config gsm8k_debug
    OPENAI_API_KEY=sk-... python environments/dataset_environment/dataset_local_server.py   # dataset_local
    python environments/dataset_environment/dataset_local_server.py --config my_run.yaml --items 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from environments.dataset_environment.dataset_env import DatasetEnv, config_from_yaml  # noqa: E402

logger = logging.getLogger("dataset_local_server")


def parse_arguments(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run a few DatasetEnv groups from a dataset config and print their scores.")
    parser.add_argument("--config", default="dataset_local",
                        help="a name in environments/dataset_environment/configs/ (without .yaml) or a YAML path")
    parser.add_argument("--items", type=int, default=5, help="prompts to run (default: 5)")
    return parser.parse_args(argv)


def _excerpt(value: object, limit: int = 200) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


async def run(config: str, items: int) -> int:
    """Score `items` groups; how many were scored."""
    env_config, server_configs = config_from_yaml(config)
    env = DatasetEnv(config=env_config, server_configs=server_configs, slurm=False, testing=False)
    scored = 0
    try:
        await env.setup()
        for number in range(1, items + 1):
            item = await env.get_next_item()
            print(f"--- item {number}/{items}")
            print(f"prompt: {_excerpt(dict(item[0][0])['content'])}")
            if item[1] is not None:
                print(f"answer: {_excerpt(item[1])}")
            if item[2] is not None:
                print(f"ground truth: {_excerpt(item[2])}")
            try:
                group, _ = await env.collect_trajectories(item)
            except Exception as exc:  # one failing prompt should not hide the others' results
                logger.error("item %d failed: %s", number, exc)
                continue
            if not group or not group["scores"]:
                print("no completions came back")
                continue
            if group.get("messages"):
                print(f"first completion: {_excerpt(group['messages'][0][-1]['content'], 300)}")
            scores = group["scores"]
            print(f"scores: {[round(s, 4) for s in scores]}  mean {sum(scores) / len(scores):.4f}")
            scored += 1
    finally:
        await env.server.close()
    print(f"=== {scored}/{items} items scored")
    return scored


def main(argv: Optional[Sequence[str]] = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        from dotenv import load_dotenv
    except ImportError:
        pass
    else:
        load_dotenv()
    args = parse_arguments(argv)
    try:
        scored = asyncio.run(run(args.config, args.items))
    except (FileNotFoundError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    sys.exit(0 if scored else 1)


if __name__ == "__main__":
    main()
