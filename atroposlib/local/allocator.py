"""A faster memory allocator for the CPU processes: tcmalloc, preloaded.

Why: a training step allocates and frees the same large buffers (activations, the bfloat16
copies of the weights, logits over the vocabulary) thousands of times. glibc's malloc hands
such blocks back to the kernel and takes the page faults again on the next allocation; on a
2-core Xeon a SmolLM2-135M GRPO step spent about a fifth of its time in the kernel doing
that. tcmalloc keeps the memory: the same step ran 1.4x faster standalone and 1.5x faster in
the RL loop (``bench/allocator.py``; jemalloc with its default settings was slower than
glibc there). PyTorch's CPU launcher (``torch.backends.xeon.run_cpu --enable-tcmalloc``) and
vLLM's CPU backend preload it for the same reason.

An allocator can only be swapped when a process starts, so `restart_with_fast_allocator`
starts the trainer once more with ``LD_PRELOAD`` (``ALLOCATOR_ENV`` marks the second start,
so it never loops) and every process it starts inherits the library; `with_fast_allocator`
adds it to the environment of a vLLM server started here. Nothing is installed: the library
is the system's (``apt install libtcmalloc-minimal4``, which ``scripts/setup.sh`` does where
it runs as root; conda's ``gperftools``); without it the system allocator is used, and the
trainer's banner says what would make its steps faster.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from pathlib import Path
from typing import Literal, Mapping, Optional

Allocator = Literal["auto", "tcmalloc", "system"]
ALLOCATORS: tuple[Allocator, ...] = ("auto", "tcmalloc", "system")
LIBRARIES = ("tcmalloc_minimal", "tcmalloc")
INSTALL_HINT = "install libtcmalloc-minimal4 (apt) or gperftools (conda)"
ALLOCATOR_ENV = "ATROPOS_PRELOADED_ALLOCATOR"
PROC_MAPS = Path("/proc/self/maps")


class AllocatorNotFoundError(RuntimeError):
    """The allocator asked for by name is not installed on this machine."""


def find_library() -> Optional[str]:
    """tcmalloc's shared library as the dynamic loader names it (``libtcmalloc_minimal.so.4``),
    or None when it is not installed."""
    for name in LIBRARIES:
        found = ctypes.util.find_library(name)
        if found:
            return found
    return None


def loaded_allocator(maps: Path = PROC_MAPS) -> Optional[str]:
    """The tcmalloc or jemalloc library mapped into this process, if one is."""
    try:
        text = maps.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        path = line.rsplit(" ", 1)[-1]
        if "libtcmalloc" in path or "libjemalloc" in path:
            return path
    return None


def with_fast_allocator(env: Mapping[str, str], library: Optional[str]) -> dict[str, str]:
    """`env` with `library` first in ``LD_PRELOAD``; unchanged when `library` is None or
    ``LD_PRELOAD`` already names tcmalloc or jemalloc (two allocators would fight)."""
    result = dict(env)
    preload = [entry for entry in result.get("LD_PRELOAD", "").replace(" ", ":").split(":") if entry]
    if library is None or any("tcmalloc" in entry or "jemalloc" in entry for entry in preload):
        return result
    result["LD_PRELOAD"] = ":".join([library, *preload])
    return result


def describe_allocator(choice: Allocator, device: str) -> str:
    """One line for a start-up banner: the allocator this process runs with, and why."""
    loaded = loaded_allocator()
    if loaded is not None:
        return f"{Path(loaded).name.split('.so')[0].removeprefix('lib')} ({loaded})"
    if choice == "system" or not device.startswith("cpu"):
        return "the system's"
    return f"the system's (CPU training steps run ~1.4x faster with tcmalloc: {INSTALL_HINT})"


def restart_with_fast_allocator(choice: Allocator, device: str) -> None:
    """Start this process again with a fast allocator preloaded, when it runs on the CPU,
    `choice` is not ``system``, none is loaded yet and one is installed; otherwise return
    (`describe_allocator` says which runs). A named allocator that is not installed raises
    `AllocatorNotFoundError`."""
    if choice == "system" or not device.startswith("cpu") or not sys.platform.startswith("linux"):
        return
    if os.environ.get(ALLOCATOR_ENV) is not None or loaded_allocator() is not None:
        return  # the second start (even if the loader could not preload it), or preloaded by the user
    library = find_library()
    if library is None:
        if choice == "tcmalloc":
            raise AllocatorNotFoundError(f"--cpu-allocator tcmalloc: the library is not installed; {INSTALL_HINT}, "
                                         "or pass --cpu-allocator auto (the system's when it is missing)")
        return
    env = with_fast_allocator(os.environ, library) | {ALLOCATOR_ENV: library}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
