"""Process mode: generate a fixed number of groups into JSONL (and an HTML page), no API.

Up to ``process_concurrency`` groups are generated at once. ``total_steps`` counts groups
*written*; groups dropped by the checks count as failures, and the run stops with an
error after ``process_max_consecutive_failures`` failures in a row. The progress bar counts
groups written (with rate and ETA) and shows rollouts as they finish: one by one for
environments built on ``collect_trajectory``, a group at a time otherwise. Each group is
generated inside a sampling record of its own, so the groups written say how they were
sampled.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from atroposlib.envs.accept import DROP_EXPLANATIONS
from atroposlib.envs.server_handling.api_server import ModelNotServed
from atroposlib.envs.server_handling.sampling_record import recording
from atroposlib.envs.server_handling.server_manager import ManagedServerUnsupported
from atroposlib.envs.tokenizer_loading import TokenizerUnavailable
from atroposlib.envs.wandb_logging import run_name
from atroposlib.frontend.jsonl2html import generate_html

log = logging.getLogger("atroposlib.envs")


class TooManyFailures(RuntimeError):
    """process mode stopped because groups kept failing."""


class ProgressBar:
    """Groups written out of the target, with rollouts finished, failures and drops."""

    def __init__(self, env: Any, target: int) -> None:
        self.env = env
        self.failures = 0
        self.bar = tqdm(total=target, desc=env.name or type(env).__name__, unit="group")
        env.on_rollouts_finished = lambda count: self.show()

    def show(self) -> None:
        self.bar.set_postfix(rollouts=self.env.rollouts_finished, failed=self.failures,
                             rejected=sum(self.env.skipped.values()), refresh=False)
        self.bar.update(0)  # redraws, at most every `mininterval`

    def group_done(self, written: int) -> None:
        if written:
            self.bar.update(written)
        else:
            self.failures += 1
        self.show()

    def close(self) -> None:
        self.env.on_rollouts_finished = None
        self.bar.close()


def _rollout_count(result: Any) -> int:
    groups = [result] if isinstance(result, dict) else [g for g in result or [] if g]
    return sum(len(group.get("tokens") or []) for group in groups)


def _counts_rollouts_itself(env: Any) -> bool:
    """Whether the env's collect_trajectories is BaseEnv's, which counts each rollout."""
    from atroposlib.envs.base import BaseEnv

    return type(env).collect_trajectories is BaseEnv.collect_trajectories


async def _one_group(env: Any, item: Any) -> int:
    """Generate, check and write the group of `item`; how many groups were written."""
    try:
        with recording():
            result, _ = await env.collect_trajectories(item)
            if not _counts_rollouts_itself(env):
                env.note_rollouts_finished(_rollout_count(result))
            if not result:
                env.skipped["no_group"] += 1
                return 0
            result = await env.postprocess_histories(result)
            kept = await env.handle_send_to_api(result, item, do_send_to_api=False,
                                                abort_on_any_max_length_exceeded=False)
            return len(kept)
    except (ManagedServerUnsupported, TokenizerUnavailable, ModelNotServed):
        raise  # a configuration error: every group would fail the same way
    except Exception:
        log.exception("a group failed")
        env.skipped["error"] += 1
        return 0
    finally:
        await env.cleanup()


async def process(env: Any) -> None:
    config = env.config
    target = config.total_steps
    env.process_mode = True
    env.n_groups_to_process = target
    env.group_size_to_process = config.group_size
    concurrency = config.process_concurrency if config.process_concurrency > 0 else max(1, env.max_num_workers)
    await env.setup()
    env.start_loading_tokenizer()
    if config.use_wandb:
        env.wandb.start(None, None, run_name(env.name), config.model_dump(mode="json"))
    written = in_a_row = 0
    running: set[asyncio.Task[int]] = set()
    exhausted = False
    progress = ProgressBar(env, target)
    try:
        while written < target:
            while not exhausted and len(running) < concurrency and written + len(running) < target:
                item = await env.get_next_item()
                if item is None:
                    exhausted = True
                    break
                running.add(asyncio.create_task(_one_group(env, item)))
            if not running:
                break
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            failures = [task.exception() for task in done if not task.cancelled() and task.exception() is not None]
            if failures:  # every one is retrieved, so none is reported again as "never retrieved"
                raise failures[0]
            for task in done:
                count = task.result()
                progress.group_done(count)
                if count:
                    written += count
                    in_a_row = 0
                    env.curr_step = written
                    await env.wandb_log()
                else:
                    in_a_row += 1
            if in_a_row >= config.process_max_consecutive_failures:
                raise TooManyFailures(f"{in_a_row} groups in a row failed or were dropped; stopping")
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        progress.close()
        env.close_jsonl_writer()
        env.wandb.finish()
        await env.server.close()
        if Path(config.data_path_to_save_groups).is_file():
            _render(config.data_path_to_save_groups)
    if written < target:
        log.warning("wrote %d of %d groups: the environment ran out of items", written, target)
    print(f"wrote {written} groups to {config.data_path_to_save_groups}" if written else
          "wrote no groups (no file left behind)")
    _report_rejections(env.skipped)


def _report_rejections(skipped: dict[str, int]) -> None:
    """Say how many generated groups were not written, and why, one line per reason."""
    if not skipped:
        return
    total = sum(skipped.values())
    print(f"{total} generated group{'s were' if total > 1 else ' was'} not written:")
    for reason, count in sorted(skipped.items(), key=lambda entry: -entry[1]):
        print(f"  {count} {reason}: {DROP_EXPLANATIONS.get(reason, 'dropped by the checks')}")


def _render(path: str) -> None:
    try:
        generate_html(path)
    except Exception as exc:  # the report is a convenience: never fail the run over it
        log.error("could not render %s as HTML: %s", path, exc)
