"""The CPU this runs on, and the dtype vLLM computes in on it.

vLLM's CPU build is fast in bfloat16 only where the CPU has bfloat16 instructions
(AVX-512 BF16 or AMX BF16). Elsewhere, on AVX2-only CPUs for instance, oneDNN cannot build
its bf16 kernels ("Failed to create oneDNN linear, fallback to torch linear") and bfloat16
generates several times fewer tokens per second than float32. `choose_dtype` makes that
choice from CPU flags it is given (so it is testable anywhere); `read_cpu` reads them from
``/proc/cpuinfo``.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
DTYPES: tuple[Dtype, ...] = ("auto", "bfloat16", "float16", "float32")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuInfo:
    """The CPU's marketing name and its feature flags."""

    model_name: str
    flags: frozenset[str]


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype vLLM is launched with, and why (one line a person can read)."""

    dtype: Dtype
    reason: str


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor's name and flags in the text of ``/proc/cpuinfo`` (x86 ``flags``
    or Arm ``Features``)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    name = fields.get("model name") or fields.get("Model") or platform.processor() or "unknown CPU"
    flags = fields.get("flags") or fields.get("Features") or ""
    return CpuInfo(name, frozenset(flags.split()))


def read_cpu(path: Path = CPUINFO) -> CpuInfo:
    """This machine's CPU (no flags when ``/proc/cpuinfo`` cannot be read, e.g. on macOS)."""
    try:
        return parse_cpuinfo(path.read_text(errors="replace"))
    except OSError:
        return CpuInfo(platform.processor() or "unknown CPU", frozenset())


def choose_dtype(flags: Iterable[str], requested: Dtype = "auto", gpu: bool = False) -> DtypeChoice:
    """The dtype for vLLM: `requested` unless it is ``auto``; on a GPU, vLLM's own choice
    (the model's dtype); on a CPU, bfloat16 with bf16 instructions, float32 without."""
    if requested != "auto":
        return DtypeChoice(requested, "asked for with --dtype")
    if gpu:
        return DtypeChoice("auto", "NVIDIA GPU: vLLM uses the model's own dtype")
    present = [flag for flag in BF16_FLAGS if flag in set(flags)]
    if present:
        return DtypeChoice("bfloat16", f"the CPU has {' and '.join(present)}: native bfloat16 kernels")
    return DtypeChoice("float32", f"the CPU has no {' or '.join(BF16_FLAGS)}: bfloat16 would fall back to "
                                  "slow kernels, float32 is several times faster")
