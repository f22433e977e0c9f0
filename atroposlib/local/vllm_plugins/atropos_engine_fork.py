"""On a CPU, vLLM's engine core is forked from its API server instead of spawned, and a
single model worker runs inside it instead of in a process of its own: the server answers
in 22.5 s instead of 51.5 s on 2 cores, generating as fast.

vLLM serves from three processes started one after the other: the API server, the engine
core and the model worker. On a GPU it forks the engine core from the API server and, with one
worker, runs that worker inside the engine core; its CPU platform spawns every process
(`VLLM_WORKER_MULTIPROC_METHOD=spawn`) and always gives the worker a process of its own (the
``mp`` executor), and each fresh interpreter imports vLLM and torch again: ~15 s apiece on a
2-core AVX2 CPU. The API server has imported all of it when it starts the engine core, so the
engine core is forked, as on a GPU; and a single worker (tensor and pipeline parallel 1) runs in
the engine core (the ``uni`` executor), its OpenMP threads on every core as the worker
process had them (atroposlib's launcher sets ``OMP_NUM_THREADS``, without which vLLM would give
the engine core one): no interpreter is spawned at all (`bench/vllm_start.py` for the figures).
A worker forked from the engine core instead generated 30-50% slower (an OpenMP thread pool
does not survive a fork), so where vLLM needs several workers they are still spawned.

vLLM loads this as a general plugin in each of its processes (the ``vllm.general_plugins``
entry point in ``atropos_vllm_plugins-1.0.dist-info`` beside this file, found because the
servers atroposlib starts have this folder on their python path); the trainer's bundled
server calls `fork_the_engine_core` itself. It changes nothing on other platforms.
"""

from __future__ import annotations

import os
from typing import Any

METHOD = "VLLM_WORKER_MULTIPROC_METHOD"
_applied = False


def fork_the_engine_core() -> None:
    """Make vLLM's CPU platform fork the next process it starts (the engine core), run a single
    worker inside it and spawn several; a second call does nothing."""
    global _applied
    if _applied:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    platform = type(current_platform)
    choose_settings = platform.check_and_update_config.__func__

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        chosen_executor = vllm_config.parallel_config.distributed_executor_backend
        choose_settings(cls, vllm_config)  # the start method spawn and the mp executor, among its settings
        os.environ[METHOD] = "fork"
        if chosen_executor == "uni":  # vLLM's own choice for one worker, which the CPU platform overrides
            vllm_config.parallel_config.distributed_executor_backend = "uni"

    platform.check_and_update_config = classmethod(check_and_update_config)
    os.register_at_fork(after_in_child=_spawn_in_the_child)
    _applied = True


def _spawn_in_the_child() -> None:
    if os.environ.get(METHOD) == "fork":
        os.environ[METHOD] = "spawn"
