"""Serve mode: keep the trajectory API supplied with scored groups until the run ends.

Start-up: wait for a trainer to register, register this env (waiting while the API says
the trainer has not started), learn the batch size, replay anything spooled. Then, ten
times a second, read ``/status-env`` and decide how many rollouts may run: a full queue
pauses *new* work (rollouts in flight finish and are sent), evaluations and checkpoints
start when the trainer's step crosses their interval, and the loop ends once the run's
last step is covered. Shutdown waits for rollouts in flight, drains the spool and tells
the API the env is leaving. Ctrl-C or SIGTERM stops it in any phase (see `StopRequest`);
a progress line is logged every ``progress_log_interval`` seconds and a summary at the end.
Each item is collected and sent inside a sampling record of its own, so its groups say how
they were sampled; an evaluation that fails is logged with its traceback and serving goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import httpx
import platformdirs

from atroposlib.envs.api_client import ApiKeyRefused, Rejected, TrajectoryApiClient, awaits_trainer
from atroposlib.envs.serve_report import ServeReport, duration
from atroposlib.envs.server_handling.api_server import ModelNotServed
from atroposlib.envs.server_handling.sampling_record import recording
from atroposlib.envs.server_handling.server_manager import ManagedServerUnsupported
from atroposlib.envs.stopping import StopRequest
from atroposlib.envs.tokenizer_loading import TokenizerUnavailable
from atroposlib.envs.types import EvalHandlingEnum
from atroposlib.envs.wandb_logging import run_name

log = logging.getLogger("atroposlib.envs")

LOOP_INTERVAL_S = 0.1
# After Ctrl-C / SIGTERM: how long rollouts in flight may finish, and the spool may drain.
SIGNAL_GRACE_S = 30.0
SIGNAL_SPOOL_DRAIN_S = 5.0


class ServeSetupError(ValueError):
    """This env's settings do not fit the trainer that registered."""


def env_key(env: Any) -> str:
    """A stable identity for re-registration: name, host and a hash of the config."""
    digest = hashlib.sha1(env.config.model_dump_json(exclude={"total_steps"}).encode()).hexdigest()[:12]
    return f"{env.config.wandb_name}:{socket.gethostname()}:{digest}"


def spool_folder(env: Any) -> Path:
    if env.config.spool_dir:
        return Path(env.config.spool_dir)
    return Path(platformdirs.user_cache_dir("atroposlib")) / "spool" / str(env.config.wandb_name)


def registration_payload(env: Any) -> dict[str, Any]:
    """The body of this env's ``/register-env`` (`atroposlib.wire.RegisterEnv`)."""
    config = env.config
    return {
        "max_token_length": config.max_token_length, "desired_name": config.wandb_name,
        "weight": config.inference_weight, "min_batch_allocation": config.min_batch_allocation,
        "group_size": config.group_size, "env_key": env_key(env),
    }


async def register(env: Any) -> dict[str, Any]:
    """Register (or re-register) this env; sets `env.env_id` and returns the answer."""
    registration = await env.api.register_env(registration_payload(env))
    env.env_id = registration["env_id"]
    return registration


async def read_status(env: Any) -> Optional[dict[str, Any]]:
    """The API's status for this env, or None while the API cannot be reached (rollouts in
    flight go on and their groups are spooled). An API that forgot this env (restarted
    without its state) gets a new registration."""
    try:
        return await env.api.get_json("/status-env", {"env_id": env.env_id})
    except Rejected as exc:
        if exc.status == 404:
            log.warning("the API does not know env %s any more: registering again", env.env_id)
            await register(env)
            return None
        if awaits_trainer(exc.status, exc.body):
            log.warning("the trajectory API holds no run any more (restarted with --fresh?): groups are spooled "
                        "while a trainer registers, then env %s registers again", env.env_id)
            await env.api.wait_for_trainer()
            await register(env)
            return None
        raise
    except httpx.HTTPError as exc:
        if not getattr(env, "_api_down", False):
            log.warning("the trajectory API is unreachable (%s): pausing new rollouts until it is back", exc)
        env._api_down = True
        return None


async def start(env: Any) -> None:
    """Set up, wait for the trainer and register with the API."""
    config = env.config
    await env.setup()
    try:
        info = await env.api.wait_for_trainer()
    except ApiKeyRefused as exc:
        raise ServeSetupError(str(exc)) from None
    if config.use_wandb:
        wandb_info = await env.api.get_json("/wandb_info")
        if wandb_info.get("project"):
            env.wandb_project, env.wandb_group = wandb_info["project"], wandb_info.get("group")
            env.wandb.start(env.wandb_project, env.wandb_group, run_name(config.wandb_name), config.model_dump(mode="json"))
        else:
            log.warning("the trainer registered no W&B project: W&B logging is off")
    registration = await register(env)
    env.wandb_prepend = registration["wandb_name"]
    env.curr_step = registration["starting_step"]
    env.checkpoint_dir = registration.get("checkpoint_dir") or ""
    env.checkpoint_interval = registration.get("checkpoint_interval") or -1
    if config.total_steps == -1:
        if registration.get("num_steps", -1) == -1:
            raise ServeSetupError("--env.total_steps is -1 and the trainer registered no num_steps; "
                                  "pass --env.total_steps")
        config.total_steps = registration["num_steps"]
    if env.curr_step > 0:
        env.load_checkpoint()
    if info.get("batch_size", -1) != -1:
        config.batch_size = info["batch_size"]
    if info.get("max_token_len", -1) != -1:
        env.max_token_len = info["max_token_len"]
    if config.group_size > config.batch_size:
        raise ServeSetupError(f"--env.group_size {config.group_size} exceeds the trainer's batch size "
                              f"{config.batch_size}; a group must fit in one batch")
    if len(env.api.spool):
        log.info("re-sending %d spooled submissions", len(env.api.spool))
        await env.api.resend_spooled()
    # now, not while registering (the thread's imports would hold the GIL the HTTP calls need):
    # it loads while the first requests are answered
    env.start_loading_tokenizer()


def _crossed(previous: int, current: int, interval: int) -> bool:
    return interval > 0 and current // interval > previous // interval


async def step_checks(env: Any, status: dict[str, Any]) -> None:
    """Start evaluations and checkpoints when the trainer's step crosses their interval."""
    current, config = status["current_step"], env.config
    if current == env.curr_step:
        return
    if _crossed(env.curr_step, current, config.steps_per_eval):
        if env.eval_runner is not None and not env.eval_runner.done():
            log.warning("the previous evaluation is still running; skipping this one")
        else:
            env.eval_runner = asyncio.create_task(env.run_evaluation())
            env.eval_runner.add_done_callback(_log_evaluation_failure)
            if config.eval_handling == EvalHandlingEnum.STOP_TRAIN:
                _cancel_all(env)
    if _crossed(env.curr_step, current, env.checkpoint_interval):
        env.save_checkpoint((current // env.checkpoint_interval) * env.checkpoint_interval)
    env.curr_step = current
    if env.items_sent_this_step >= config.min_items_sent_before_logging:
        env.items_sent_this_step = 0
        await env.wandb_log({})


def _log_evaluation_failure(task: asyncio.Task[Any]) -> None:
    # nothing awaits the evaluation task: without this its exception would surface, if
    # ever, as "Task exception was never retrieved" when the task is collected
    if not task.cancelled() and task.exception() is not None:
        log.error("evaluate() failed; serving goes on", exc_info=task.exception())


def queue_is_full(env: Any, status: dict[str, Any]) -> bool:
    config = env.config
    mbo, gs, bs = config.max_batches_offpolicy, config.group_size, config.batch_size
    if mbo <= 0 or status["queue_size"] * gs < mbo * bs:
        return False
    if config.min_batch_allocation is None:
        return True
    largest = max(1, status.get("max_group_size", gs))
    needed = math.ceil(config.min_batch_allocation * bs * mbo / largest) * max(1, largest // gs)
    return needed - status.get("self_queue_size", 0) <= 0


def worker_cap(env: Any, status: dict[str, Any]) -> int:
    """How many rollouts may run now (Atropos's arithmetic)."""
    config = env.config
    cap = env.max_num_workers
    if env.eval_runner is not None and not env.eval_runner.done():
        if config.eval_handling == EvalHandlingEnum.STOP_TRAIN:
            return 0
        if config.eval_handling == EvalHandlingEnum.LIMIT_TRAIN:
            cap = int(env.max_num_workers * config.eval_limit_ratio)
    queue_size = status["queue_size"]
    cap = min(cap, config.max_batches_offpolicy * env.derived_batch_size // config.group_size - queue_size) \
        if config.max_batches_offpolicy > 0 else cap
    if config.min_batch_allocation is not None:
        largest = max(1, status.get("max_group_size", config.group_size))
        gs = config.group_size
        own = status.get("self_queue_size", 0)
        need = math.ceil(
            ((math.ceil(config.min_batch_allocation * config.batch_size * config.max_batches_offpolicy / largest)
              + largest // gs) * largest - (largest * own // (largest / gs))) / gs
        )
        cap = max(cap, max(0, need))
    return cap


async def run_item(env: Any, key: str, item: Any) -> None:
    """One rollout: collect, post-process, send; timing and backlog bookkeeping. The
    item's sampling record is open throughout, for `handle_send_to_api` to stamp from."""
    with recording():
        await _collect_and_send(env, key, item)


async def _collect_and_send(env: Any, key: str, item: Any) -> None:
    started = time.monotonic()
    result = None
    try:
        result, backlog = await env.collect_trajectories(item)
        env.backlog.extend(backlog or [])
        if result:
            result = await env.postprocess_histories(result)
    except asyncio.CancelledError:
        raise
    except (ManagedServerUnsupported, TokenizerUnavailable, ModelNotServed) as exc:
        env.fatal_error = exc  # the main loop stops the run with it
        result = None
    except Exception:
        log.exception("collect_trajectories failed")
        result = None
    finally:
        env.running_items.pop(key, None)
    duration = time.monotonic() - started
    env.task_duration.append(duration)
    (env.succeeded_task_duration if result else env.failed_task_duration).append(duration)
    try:
        if result is not None:
            await env.handle_send_to_api(result, item)
            env.last_completed_item = item
    except TokenizerUnavailable as exc:
        env.fatal_error = exc
    except Exception:
        log.exception("sending a group failed")
    finally:
        await env.cleanup()


def spawn(env: Any, item: Any, attempt: int = 0) -> None:
    key = uuid.uuid4().hex
    task = asyncio.create_task(run_item(env, key, item))
    env.running_items[key] = {"item": item, "worker": task, "start_time": time.monotonic(), "attempt": attempt}
    env.workers.add(task)
    task.add_done_callback(env.workers.discard)


async def add_workers(env: Any, status: dict[str, Any]) -> None:
    cap = worker_cap(env, status)
    if env.curr_step or env.workers:
        env.workers_added_list.append(cap - len(env.workers))
    while len(env.workers) < cap:
        item = env.backlog.pop() if env.backlog else await env.get_next_item()
        if item is None:
            return
        spawn(env, item)


def expire_slow_rollouts(env: Any) -> None:
    """Cancel rollouts older than worker_timeout; retry their items a bounded number of times."""
    timeout = env.config.worker_timeout
    if timeout <= 0:
        return
    now = time.monotonic()
    for key, entry in list(env.running_items.items()):
        if now - entry["start_time"] <= timeout:
            continue
        entry["worker"].cancel()
        env.running_items.pop(key, None)
        if entry["attempt"] < env.config.worker_timeout_retries:
            spawn(env, entry["item"], entry["attempt"] + 1)
        else:
            env.skipped["timed_out"] += 1
            log.error("an item timed out %d times; dropped", entry["attempt"] + 1)


def _cancel_all(env: Any) -> None:
    for key, entry in list(env.running_items.items()):
        env.backlog.append(entry["item"])
        entry["worker"].cancel()
        env.running_items.pop(key, None)


async def main_loop(env: Any, report: ServeReport) -> None:
    """Keep rollouts running until the run's last step is covered."""
    config = env.config
    while True:
        if getattr(env, "fatal_error", None) is not None:
            raise env.fatal_error
        now = time.monotonic()
        if env.last_loop_time is not None:
            env.mainloop_timings.append(now - env.last_loop_time)
        env.last_loop_time = now
        status = await read_status(env)
        if status is None:
            expire_slow_rollouts(env)
            await asyncio.sleep(1.0)
            continue
        if getattr(env, "_api_down", False):
            log.info("the trajectory API is back")
            env._api_down = False
        env.status_dict = status
        env.max_num_workers = env.resolved_max_num_workers()
        env.server.update_weight(status["env_weight"])
        await step_checks(env, status)
        report.maybe_log(env, status)
        if status["current_step"] + status["queue_size"] * config.group_size // max(1, config.batch_size) > config.total_steps:
            return
        paused = env.api.spool.size_bytes() > config.spool_max_bytes
        if queue_is_full(env, status) or env.derived_batch_size == -1 or paused:
            if config.cancel_workers_on_backpressure:
                _cancel_all(env)
        elif len(env.workers) < env.max_num_workers:
            await add_workers(env, status)
        expire_slow_rollouts(env)
        if len(env.api.spool):
            await env.api.resend_spooled()
        await asyncio.sleep(LOOP_INTERVAL_S)


def _grace_s(env: Any) -> float:
    """How long an orderly end of the run waits for rollouts in flight."""
    return env.config.worker_timeout if env.config.worker_timeout > 0 else 60


async def _finish_rollouts(env: Any, stop: StopRequest) -> None:
    """Give rollouts in flight their grace (short after a signal, none after a second)."""
    if env.eval_runner is not None and not env.eval_runner.done():
        env.eval_runner.cancel()
    grace = _grace_s(env)
    if stop.orderly.is_set():
        grace = min(grace, SIGNAL_GRACE_S)
    in_flight = set(env.workers)
    if in_flight and not stop.immediate.is_set():
        log.info("waiting up to %s for %d groups in progress", duration(grace), len(in_flight))
        await stop.unless(stop.next_level(), asyncio.wait(in_flight, timeout=grace))
    cancelled = set(env.workers)
    for task in cancelled:
        task.cancel()
    if cancelled:
        log.info("cancelled %d groups in progress", len(cancelled))
        await asyncio.wait(cancelled, timeout=5)


async def _drain_spool(env: Any, stop: StopRequest) -> None:
    """Deliver what is spooled while the API answers; what remains stays for the next start."""
    if not len(env.api.spool):
        return
    if getattr(env, "_api_down", False) or stop.immediate.is_set():
        deadline = 0.0
    elif stop.orderly.is_set():
        deadline = SIGNAL_SPOOL_DRAIN_S
    else:
        deadline = min(_grace_s(env), 60)
    if deadline:
        await stop.unless(stop.next_level(), env.api.drain_spool(deadline_s=deadline))
    if len(env.api.spool):
        log.warning("%d submissions remain spooled in %s; they are re-sent at the next start",
                    len(env.api.spool), env.api.spool.folder)


async def shutdown(env: Any, stop: StopRequest) -> None:
    """Let rollouts in flight finish, deliver what is spooled, leave the API cleanly."""
    try:
        await _finish_rollouts(env, stop)
        await _drain_spool(env, stop)
    finally:
        env.close_jsonl_writer()
        if env.config.disconnect_on_exit and env.env_id is not None:
            await env.api.disconnect(env.env_id)
        env.wandb.finish()
        await env.server.close()
        await env.api.close()


async def _run(env: Any, report: ServeReport) -> None:
    await start(env)
    await main_loop(env, report)


async def serve(env: Any) -> None:
    """Serve mode, from start-up to a clean exit (also on Ctrl-C and SIGTERM)."""
    env.api = TrajectoryApiClient(env.config.rollout_server_url, spool_folder(env))
    report = ServeReport(env.config.progress_log_interval)
    stop = StopRequest()
    outcome = "interrupted"
    with stop.installed():
        try:
            finished, _ = await stop.unless(stop.orderly, _run(env, report))
            outcome = (f"total_steps {env.config.total_steps} reached, counting the groups queued at the API" if finished
                       else f"{stop.signal_name} received")
        except Exception as exc:
            outcome = f"failed: {type(exc).__name__}: {exc}"
            raise
        finally:
            await shutdown(env, stop)
            log.info(report.summary(env, outcome))
