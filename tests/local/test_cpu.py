"""The dtype vLLM is launched with, chosen from CPU flags given to the function."""

from __future__ import annotations

from pathlib import Path

import pytest

from atroposlib.local.cpu import choose_dtype, parse_cpuinfo, read_cpu

AVX2_ONLY = "fpu sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2".split()
AVX512_BF16 = AVX2_ONLY + ["avx512f", "avx512bw", "avx512_bf16"]
AMX = AVX2_ONLY + ["avx512f", "amx_tile", "amx_bf16", "amx_int8"]


def test_bfloat16_only_with_bf16_instructions() -> None:
    assert choose_dtype(AVX2_ONLY).dtype == "float32"
    assert choose_dtype(AVX2_ONLY + ["avx512f", "avx512bw"]).dtype == "float32"  # AVX-512 without BF16
    assert choose_dtype([]).dtype == "float32"
    assert choose_dtype(AVX512_BF16).dtype == "bfloat16"
    assert choose_dtype(AMX).dtype == "bfloat16"


def test_the_reason_names_what_decided() -> None:
    assert "no avx512_bf16 or amx_bf16" in choose_dtype(AVX2_ONLY).reason
    assert "amx_bf16" in choose_dtype(AMX).reason and "avx512_bf16" not in choose_dtype(AMX).reason


def test_an_explicit_dtype_and_a_gpu_win_over_the_cpu() -> None:
    assert choose_dtype(AVX2_ONLY, "bfloat16") == choose_dtype(AMX, "bfloat16")
    assert choose_dtype(AVX2_ONLY, "bfloat16").dtype == "bfloat16"
    assert "--dtype" in choose_dtype(AVX2_ONLY, "float16").reason
    on_gpu = choose_dtype(AVX2_ONLY, gpu=True)
    assert on_gpu.dtype == "auto" and "GPU" in on_gpu.reason


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu avx avx2 fma

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu avx avx2 fma
"""


def test_cpuinfo_is_parsed_for_name_and_flags(tmp_path: Path) -> None:
    info = parse_cpuinfo(CPUINFO)
    assert info.model_name == "AMD EPYC 7B13" and info.flags == {"fpu", "avx", "avx2", "fma"}
    arm = parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert arm.flags == {"fp", "asimd", "bf16"} and choose_dtype(arm.flags).dtype == "float32"
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    assert read_cpu(tmp_path / "cpuinfo") == info
    assert read_cpu(tmp_path / "missing").flags == frozenset()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo")
def test_this_machine_gets_a_choice() -> None:
    info = read_cpu()
    assert info.model_name and choose_dtype(info.flags).dtype in ("bfloat16", "float32")
