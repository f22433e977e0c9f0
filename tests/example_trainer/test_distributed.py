"""The trainer on several processes (torch.distributed, gloo on the CPU): two ranks train
like one (the same weights after AdamW steps, and the same gradient for every loss, on
off-policy batches, with and without TIS), bfloat16 compute on two ranks keeps the float32
update, a two-rank checkpoint resumes in one process, and a rank that dies ends the run in
one line with its batch back in the API's queue."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from example_trainer.cli import parse_config
from example_trainer.config import TrainingConfig
from example_trainer.data import prepare_batch
from example_trainer.distributed import Ranks, _is_block, ranks_from
from tests.doc_commands import readme_arguments
from tests.example_trainer.distributed_steps import GRADIENT_CASES, batch_items
from tests.example_trainer.test_precision import flat_update
from tests.example_trainer.test_trainers import post_groups
from tests.helpers import ApiProcess, free_port
from tests.local.stand_ins import stand_in_runtime
from tests.once_per_run import made_once

torch = pytest.importorskip("torch")
STEPS_SCRIPT = Path(__file__).with_name("distributed_steps.py")
ROOT = Path(__file__).resolve().parents[2]


def run_steps(model: Path, folder: Path, ranks: int, plan: dict[str, list[str]]) -> None:
    """Each run of `plan` (a name and `distributed_steps.py`'s options), in one launch of `ranks`
    processes: rank 0 writes what each run gives to `folder`/results.pt."""
    folder.mkdir()
    (folder / "plan.json").write_text(json.dumps(plan))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-port", str(free_port()), str(STEPS_SCRIPT), "--model", str(model),
               "--out", str(folder / "results.pt"), str(folder / "plan.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def launch_every_run(model: Path, folder: Path) -> None:
    """Every run the tests compare, in two launches: on two ranks, three AdamW steps with DDP and
    with FSDP, each loss's one-step gradient (plain SGD), two bfloat16 steps at lr 1e-5 and an
    FSDP checkpoint after step 2; then on one rank, what those must match (three AdamW steps,
    the gradients, two float32 steps at lr 1e-5) and that checkpoint resumed. The model is copied
    in, so that every worker compares against the weights these runs started from."""
    shutil.copytree(model, folder / "model")
    two = {"saved": ["--data-parallel", "fsdp", "--save-at", "2", "--save-path", str(folder / "checkpoints")]}
    for parallel in ("ddp", "fsdp"):
        two[f"train-{parallel}"] = ["--data-parallel", parallel]
        two[f"gradients-{parallel}"] = ["--gradient-cases", "--data-parallel", parallel]
        two[f"bfloat16-{parallel}"] = ["--lr", "1e-5", "--steps", "2", "--dtype", "bfloat16",
                                       "--data-parallel", parallel]
    run_steps(folder / "model", folder / "two-ranks", 2, two)
    one = {"train": [], "gradients": ["--gradient-cases"], "float32": ["--lr", "1e-5", "--steps", "2"],
           "resumed": ["--resume", str(folder / "checkpoints" / "step_2")]}
    run_steps(folder / "model", folder / "one-rank", 1, one)


def assert_same_training(one: dict, other: dict) -> None:
    assert other["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-7)
    assert one["weights"].keys() == other["weights"].keys()
    for name, tensor in one["weights"].items():
        torch.testing.assert_close(other["weights"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_ranks_come_from_torchrun_else_from_the_config() -> None:
    config = TrainingConfig(model_name="m", world_size=3, trainer_rank=2)
    assert ranks_from(config, {}) == Ranks(rank=2, world_size=3, local_rank=2)
    assert ranks_from(config, {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}) == Ranks(1, 4, 0)
    assert ranks_from(TrainingConfig(model_name="m"), {}).distributed is False


def test_the_readmes_torchrun_command_is_a_valid_trainer_command() -> None:
    argv = readme_arguments("distributed-training", "torchrun --nproc-per-node 4 -m example_trainer.grpo",
                            MODEL="org/model")
    config = parse_config(argv)
    assert (config.model_name, config.data_parallel, config.weight_bridge_mode) == ("org/model", "fsdp", "reload")


def test_fsdp_shards_each_transformer_block() -> None:
    assert _is_block("model.layers.3") and _is_block("transformer.h.0")
    assert not _is_block("model.layers") and not _is_block("model.layers.3.mlp")


def test_the_ranks_shares_make_up_the_batch_and_keep_its_totals() -> None:
    whole = prepare_batch(batch_items(0), 2, pack=True, pad_multiple=1)
    shares = [prepare_batch(batch_items(0), 2, pack=True, pad_multiple=1, rank=rank, world_size=2)
              for rank in range(2)]
    assert [share.num_sequences for share in shares] == [whole.num_sequences] * 2
    assert [share.num_tokens for share in shares] == [whole.num_tokens] * 2
    rows = sorted(int((m.labels != -100).sum()) for share in shares for m in share.micro_batches)
    assert sum(rows) == whole.num_tokens
    assert [len(share.micro_batches) for share in shares] == [2, 1]  # 3 and 2 of the 5 rollouts


@pytest.fixture(scope="module")
def launches(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two launches' folder, made once for all the workers that run these tests."""
    return made_once(tmp_path_factory, "distributed-runs", lambda folder: launch_every_run(tiny_model, folder))


@pytest.fixture(scope="module")
def two_ranks(launches: Path) -> dict[str, dict]:
    return torch.load(launches / "two-ranks" / "results.pt", weights_only=True)


@pytest.fixture(scope="module")
def one_rank(launches: Path) -> dict[str, dict]:
    trained = torch.load(launches / "one-rank" / "results.pt", weights_only=True)
    assert len(trained["train"]["losses"]) == 3
    return trained


@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_two_ranks_train_like_one(data_parallel: str, one_rank: dict, two_ranks: dict) -> None:
    assert_same_training(one_rank["train"], two_ranks[f"train-{data_parallel}"])


def test_a_two_rank_checkpoint_resumes_in_one_process(one_rank: dict, launches: Path) -> None:
    assert (launches / "checkpoints" / "step_2" / "optimizer.pt").is_file()
    trained = one_rank["train"]
    assert_same_training({**trained, "losses": trained["losses"][2:]}, one_rank["resumed"])


@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_two_ranks_compute_the_gradient_of_one_for_every_loss(data_parallel: str, one_rank: dict,
                                                              two_ranks: dict) -> None:
    # Plain SGD, no clipping: a wrong world-size factor would scale these changes, which AdamW hides.
    one, two = one_rank["gradients"]["changes"], two_ranks[f"gradients-{data_parallel}"]["changes"]
    assert set(two) == set(GRADIENT_CASES) == set(one)
    for case, changes in one.items():
        largest = max(float(change.abs().max()) for change in changes.values())
        assert largest > 0, case
        for name, change in changes.items():
            torch.testing.assert_close(two[case][name], change, rtol=1e-4, atol=1e-4 * largest,
                                       msg=f"{case}: {name}")


@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_bfloat16_compute_on_two_ranks_keeps_the_float32_update(data_parallel: str, one_rank: dict, two_ranks: dict,
                                                                launches: Path) -> None:
    from safetensors.torch import load_file

    start = load_file(str(launches / "model" / "model.safetensors"))
    reference = flat_update(one_rank["float32"]["weights"], start)
    mixed = two_ranks[f"bfloat16-{data_parallel}"]["weights"]
    update = flat_update(mixed, start)
    assert float(update.norm() / reference.norm()) >= 0.5
    assert float(torch.nn.functional.cosine_similarity(update, reference, dim=0)) >= 0.5
    assert all(tensor.dtype == torch.float32 for tensor in mixed.values())


def rank_command(api: ApiProcess, model: Path, tmp_path: Path, rank: int, init: str) -> list[str]:
    command = [sys.executable, "-m", "example_trainer.grpo", "--model-name", str(model), "--device", "cpu",
               "--optimizer", "adamw", "--training-steps", "4", "--batch-size", "2",
               "--gradient-accumulation-steps", "2", "--atropos-url", api.url, "--save-path",
               str(tmp_path / "checkpoints"), "--log-dir", str(tmp_path / f"logs{rank}"),
               "--world-size", "2", "--trainer-rank", str(rank), "--init-method", init]
    if rank == 0:
        command += ["--vllm-python", str(stand_in_runtime(tmp_path).python), "--vllm-port", str(free_port())]
    return command


def wait_for(path: Path, text: str, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        alive = process.poll() is None and time.monotonic() < deadline
        assert alive, path.read_text(errors="replace")[-3000:]
        time.sleep(0.2)


def test_a_rank_that_dies_ends_the_run_in_one_line_and_loses_no_batch(api: ApiProcess, tiny_model: Path,
                                                                      tmp_path: Path) -> None:
    post_groups(api, 8)  # eight batches of one group of 4
    init = f"tcp://127.0.0.1:{free_port()}"
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    with open(logs[0], "wb") as out0, open(logs[1], "wb") as out1:
        environment = {**os.environ, "STAND_IN_PIDS": str(tmp_path / "pids")}
        ranks = [subprocess.Popen(rank_command(api, tiny_model, tmp_path, rank, init), cwd=tmp_path, env=environment,
                                  stdout=out, stderr=subprocess.STDOUT) for rank, out in enumerate((out0, out1))]
        try:
            wait_for(logs[0], "grad norm", ranks[0])  # the first step's line
            ranks[1].send_signal(signal.SIGKILL)
            assert ranks[0].wait(120) == 1
        finally:
            for process in ranks:
                process.kill()
                process.wait()
    output = logs[0].read_text()
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "another process of the distributed run" in errors[0], output[-3000:]
    assert "Traceback" not in output
    status = httpx.get(api.url + "/status").json()
    acknowledged = status["current_step"]
    assert acknowledged >= 1
    assert status["leased_batches"] == 0
    assert status["queue_size"] == 8 - acknowledged  # a batch is one group: leased, untrained ones are back


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_rank_waiting_for_missing_peers_says_so_and_stops_on_a_signal(tiny_model: Path, tmp_path: Path,
                                                                       signum: int) -> None:
    command = [sys.executable, "-u", "-m", "example_trainer.grpo", "--model-name", str(tiny_model),
               "--world-size", "2", "--trainer-rank", "0", "--init-method", f"tcp://127.0.0.1:{free_port()}",
               "--atropos-url", f"http://127.0.0.1:{free_port()}", "--save-path", str(tmp_path / "checkpoints")]
    trainer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert trainer.stdout is not None
        first = trainer.stdout.readline()
        assert "rank 0 of 2: waiting for the other processes to join at tcp://" in first
        time.sleep(0.5)
        trainer.send_signal(signum)
        assert trainer.wait(20) != 0
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(10)


def test_a_rank_whose_peers_never_come_stops_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime

    from example_trainer import distributed

    monkeypatch.setattr(distributed, "JOIN_TIMEOUT", datetime.timedelta(seconds=2))
    config = TrainingConfig(model_name="m", world_size=2, trainer_rank=0, init_method=f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(distributed.DistributedError, match="rank 0 of 2 could not join the run at tcp://"):
        distributed.start(config)


def test_leaving_the_group_frees_the_ddp_model_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DDP model left in a reference cycle would otherwise be freed by the collector at exit,
    after the group is destroyed: its reducer, then the group's last holder, joins the gloo threads
    with the GIL held and the process can hang after training (seen in the Slurm trainer job)."""
    import weakref

    import torch.distributed as dist

    from example_trainer import distributed

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = distributed.wrap(torch.nn.Linear(2, 2), TrainingConfig(model_name="m", device="cpu"), Ranks(0, 2, 0))
        model.cycle = [model]  # as the trainer's run, its hooks and its model refer to one another
        freed_before_destroy = []
        destroy = dist.destroy_process_group
        monkeypatch.setattr(dist, "destroy_process_group",
                            lambda: (freed_before_destroy.append(alive() is None), destroy()))
        alive = weakref.ref(model)
        del model
        distributed.stop(Ranks(0, 2, 0))
        assert freed_before_destroy == [True]
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
