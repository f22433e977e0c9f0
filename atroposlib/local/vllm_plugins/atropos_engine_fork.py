"""On a CPU, vLLM's engine core is forked from its API server instead of spawned: a start
~13 s shorter on 2 cores.

vLLM serves from three processes started one after the other: the API server, the engine
core and the model worker. On a GPU it forks the engine core from the API server; its CPU
platform starts every process by spawning (`VLLM_WORKER_MULTIPROC_METHOD=spawn`), and each
fresh interpreter imports vLLM and torch again: ~15 s apiece on a 2-core AVX2 CPU. The API
server has imported all of it when it starts the engine core, so the engine core is forked,
as on a GPU: the server answers after 33.5 s instead of 46.8 s, with the same answers and
the same tokens per second (bundled model, float32, median of 3: `bench/vllm_start.py`). The
worker is still spawned: forked from the engine core, it generated 30-50% slower (an OpenMP
thread pool does not survive a fork).

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
    """Make vLLM's CPU platform fork the next process it starts (the engine core), whose
    own children (the workers) are spawned again; a second call does nothing."""
    global _applied
    if _applied:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    platform = type(current_platform)
    choose_settings = platform.check_and_update_config.__func__

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        choose_settings(cls, vllm_config)  # sets the start method to spawn, among its settings
        os.environ[METHOD] = "fork"

    platform.check_and_update_config = classmethod(check_and_update_config)
    os.register_at_fork(after_in_child=_spawn_in_the_child)
    _applied = True


def _spawn_in_the_child() -> None:
    if os.environ.get(METHOD) == "fork":
        os.environ[METHOD] = "spawn"
