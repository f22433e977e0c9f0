"""The trainer's GPU path in a few minutes, with no internet and no vLLM.

    python bench/gpu_smoke.py                 # on a machine with an NVIDIA GPU
    python bench/gpu_smoke.py --device cpu    # the same checks on a CPU (float32, gloo)

On the tiny test model (a 2-layer Llama with the project's offline tokenizer) it checks, each
in its own process, what a GPU run needs and no CPU test exercises:

1. ``atropos-grpo`` itself, against ``run-api`` and a stand-in inference server that takes
   ``POST /reload_weights`` (``tests/fake_openai.py``): bfloat16 compute over float32 master
   weights (the checkpoints float32), sdpa
   attention, gradient checkpointing, a checkpoint every step handed to the server
   (``--weight-bridge-mode reload``), then a second run resumed from the first checkpoint;
2. LoRA: only the (float32) adapters train, over a bfloat16 base with gradient checkpointing;
3. DDP with one rank on NCCL (gloo on a CPU), under torchrun.

Each check prints PASS or FAIL with its wall time; the exit status is 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from atroposlib.local.signals import signal_group  # noqa: E402  (after the path)
from tests.example_trainer.distributed_steps import batch_items  # noqa: E402
from tests.helpers import ApiProcess, free_port  # noqa: E402

STEPS_GROUPS = 6  # groups posted: two steps, then two more after resuming, and spare ones
STOP_GRACE = 20.0  # seconds a command stopped for overrunning has to end before it is killed


def dtype_of(device: str) -> str:
    return "bfloat16" if device.startswith("cuda") else "float32"


def run(command: list[str], log: Path, timeout: float = 240) -> str:
    """`command`'s output (also in `log`); raises with its tail when it fails or outlives `timeout`.

    The command leads a process group of its own, which ends with it: on an overrun or a Ctrl-C
    here it is stopped whole, since torchrun's ranks are its children and killing torchrun alone
    would leave a hung rank behind."""
    environment = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                          env=environment, start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            output = stop_group(process) + f"\n[gpu_smoke: stopped after its {timeout:.0f} s limit]"
        except BaseException:
            stop_group(process)
            raise
        finally:
            signal_group(process.pid, signal.SIGKILL)  # what outlived its leader
    log.write_text(output)
    if process.returncode != 0:
        raise AssertionError(f"{' '.join(command[:4])} ... exited {process.returncode}:\n{output[-2500:]}")
    return output


def stop_group(process: subprocess.Popen[str]) -> str:
    """SIGTERM `process`'s group (torchrun hands it on to its ranks), then SIGKILL it if its
    output is still open after `STOP_GRACE` seconds; returns what the group printed."""
    signal_group(process.pid, signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        signal_group(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return output or ""


def post_groups(api_url: str, count: int) -> None:
    import httpx

    for index in range(count):
        group = batch_items(index)[0]
        body = {"tokens": group["tokens"], "masks": group["masks"], "scores": [1.0, 0.0, 0.5]}
        httpx.post(api_url + "/scored_data", json=body, timeout=10).raise_for_status()


def trainer_command(model: Path, work: Path, device: str, api_url: str, server_url: str, steps: int,
                    *extra: str) -> list[str]:
    return [sys.executable, "-m", "example_trainer.grpo", "--model-name", str(model), "--device", device,
            "--dtype", dtype_of(device), "--optimizer", "adamw", "--lr", "1e-4", "--training-steps", str(steps),
            "--batch-size", "3", "--gradient-accumulation-steps", "1", "--seq-len", "64",
            "--weight-bridge-mode", "reload", "--inference-server-urls", server_url, "--vllm-restart-interval", "1",
            "--gradient-checkpointing", "--save-path", str(work / "checkpoints"), "--log-dir", str(work / "logs"),
            "--atropos-url", api_url, *extra]


def check_trainer(model: Path, work: Path, device: str) -> str:
    """bfloat16 steps over float32 master weights with sdpa and gradient checkpointing, each
    (float32) checkpoint reloaded by the stand-in server, then a run resumed from step 1."""
    import torch
    from safetensors.torch import load_file

    port = free_port()
    server_log = open(work / "stand-in.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "tests.fake_openai", "--port", str(port)], cwd=ROOT,
                              stdout=server_log, stderr=subprocess.STDOUT)
    try:
        with ApiProcess(None) as api:
            post_groups(api.url, STEPS_GROUPS)
            server_url = f"http://127.0.0.1:{port}"
            first = run(trainer_command(model, work, device, api.url, server_url, 2), work / "trainer.log")
            assert "attention sdpa" in first and dtype_of(device) in first, first[-1500:]
            assert "weights to train in float32" in first, first[-1500:]  # float32 masters whatever the compute
            saved = load_file(str(work / "checkpoints" / "step_1" / "model.safetensors"))
            assert all(tensor.dtype == torch.float32 for tensor in saved.values()), "checkpoint not float32"
            resumed = run(trainer_command(model, work, device, api.url, server_url, 3, "--resume-from",
                                          str(work / "checkpoints" / "step_1"), "--replace-run"),
                          work / "resumed.log")
            assert "resuming from" in resumed and "at step 1" in resumed, resumed[-1500:]
    finally:
        server.terminate()
        server.wait(30)
        server_log.close()
    reloads = [line for line in (work / "stand-in.log").read_text().splitlines() if line.startswith("reloaded")]
    assert len(reloads) >= 3, reloads
    step_lines = [line for line in first.splitlines() if line.startswith("step ") and "loss" in line]
    return f"{len(reloads)} reloads; {step_lines[-1][:90] if step_lines else ''}"


def check_lora(model: Path, work: Path, device: str) -> str:
    """Only the adapters change, in bfloat16 with gradient checkpointing."""
    code = f"""
import torch
from example_trainer.config import TrainingConfig
from example_trainer.data import prepare_batch
from example_trainer.model import load_model_and_tokenizer
from example_trainer.optim import create_optimizer
from example_trainer.training import run_training_step
from tests.example_trainer.distributed_steps import batch_items
config = TrainingConfig(model_name={str(model)!r}, device={device!r}, dtype={dtype_of(device)!r}, optimizer="adamw",
                        lr=1e-3, batch_size=2, seq_len=64, weight_bridge_mode="lora_only", gradient_checkpointing=True,
                        lora_target_modules=["q_proj", "v_proj"])
model, _ = load_model_and_tokenizer(config)
before = {{name: p.detach().clone() for name, p in model.named_parameters()}}
optimizer = create_optimizer(model, config)
for step in range(2):
    metrics = run_training_step(model, optimizer, prepare_batch(batch_items(step), 2, pack=True), config, step)
    assert torch.isfinite(torch.tensor(metrics["loss"])), metrics
changed = {{name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])}}
assert changed and all("lora_" in name for name in changed), sorted(changed)[:5]
print(f"result: {{len(changed)}} adapter tensors changed, base untouched, grad norm {{metrics['grad_norm']:.3f}}")
"""
    output = run([sys.executable, "-c", code], work / "lora.log")
    return [line for line in output.splitlines() if line.startswith("result: ")][-1][len("result: "):]


def ddp_worker(model: Path, device: str) -> None:
    """Under torchrun: two steps of DDP on one rank (NCCL on a GPU, gloo on a CPU)."""
    import torch.distributed as dist

    from example_trainer.distributed import leave_process_group

    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    try:
        norms = ddp_steps(model, device)
        print(json.dumps({"backend": dist.get_backend(), "grad_norms": norms}))
    finally:
        leave_process_group()  # the DDP model, garbage once `ddp_steps` returned, collected first


def ddp_steps(model: Path, device: str) -> list[float]:
    """The gradient norms of two DDP steps; the model and optimizer go with the call's frame."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from example_trainer.config import TrainingConfig
    from example_trainer.data import prepare_batch
    from example_trainer.model import load_model_and_tokenizer
    from example_trainer.optim import create_optimizer
    from example_trainer.training import run_training_step

    config = TrainingConfig(model_name=str(model), device=device, dtype=dtype_of(device), optimizer="adamw",
                            lr=1e-3, batch_size=2, seq_len=64)
    loaded, _ = load_model_and_tokenizer(config)
    wrapped = DistributedDataParallel(loaded, device_ids=[0] if device.startswith("cuda") else None)
    optimizer = create_optimizer(wrapped, config)
    norms = [run_training_step(wrapped, optimizer, prepare_batch(batch_items(step), 2, pack=True), config,
                               step)["grad_norm"] for step in range(2)]
    assert all(torch.isfinite(torch.tensor(norms))) and all(norm > 0 for norm in norms), norms
    return norms


def check_ddp(model: Path, work: Path, device: str) -> str:
    output = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port",
                  str(free_port()), __file__, "--ddp-worker", "--model", str(model), "--device", device],
                 work / "ddp.log")
    result = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
    return f"backend {result['backend']}, grad norms {', '.join(f'{norm:.3f}' for norm in result['grad_norms'])}"


CHECKS: list[tuple[str, Callable[[Path, Path, str], str]]] = [
    ("atropos-grpo: bfloat16 (float32 on a CPU), sdpa, gradient checkpointing, reload, checkpoint + resume",
     check_trainer),
    ("LoRA", check_lora),
    ("DDP, one rank", check_ddp),
]


def build_model(folder: Path) -> Path:
    from tests.example_trainer.tiny_model import build_tiny_model
    from tests.tokenizer_fixture import build_tokenizer

    return build_tiny_model(folder / "model", build_tokenizer(folder / "tokenizer"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda (default when a GPU is there) or cpu")
    parser.add_argument("--keep", type=Path, default=None, help="keep the logs and checkpoints in this folder")
    parser.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.ddp_worker:
        ddp_worker(args.model, device)
        return
    work = args.keep or Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "CPU"
    print(f"gpu_smoke on {device} ({name}), torch {torch.__version__}, logs in {work}", flush=True)
    model = build_model(work)
    failed = 0
    for title, check in CHECKS:
        started = time.monotonic()
        folder = work / check.__name__
        folder.mkdir(exist_ok=True)
        try:
            detail = check(model, folder, device)
            print(f"PASS {title} ({time.monotonic() - started:.1f} s): {detail}", flush=True)
        except Exception as exc:  # a failed check is reported and the next one runs
            failed += 1
            print(f"FAIL {title} ({time.monotonic() - started:.1f} s): {exc}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
