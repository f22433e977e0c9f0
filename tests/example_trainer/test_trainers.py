"""The training loop against a real `run-api`, on a tiny model, with vLLM replaced by a
recording stand-in: batches acknowledged after their step, syncs and checkpoints on
schedule, resume continues the step count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from example_trainer import trainers
from example_trainer.config import TrainingConfig
from example_trainer.model import LORA_MODES
from example_trainer.weight_sync import WeightSync
from tests.conftest import group
from tests.doc_commands import readme_arguments
from tests.helpers import ApiProcess, free_port
from tests.local.stand_ins import all_gone, killed_at_exit, parent_of, recorded_pids, stand_in_runtime

torch = pytest.importorskip("torch")


class RecordingSync(WeightSync):
    """Stands in for vLLM: records the weights it is given."""

    def __init__(self, config: TrainingConfig) -> None:
        super().__init__(config, None)
        self.saves_adapters = config.weight_bridge_mode in LORA_MODES
        self.events: list[tuple[str, str]] = []
        self.versions: list[int] = []

    def start(self, weights: str, policy_version: int) -> float:
        self.events.append(("start", weights))
        self.versions.append(policy_version)
        return 0.0

    def publish(self, checkpoint: str, step: int) -> float:
        self.events.append(("publish", Path(checkpoint).name))
        self.versions.append(step)
        return 0.0

    def finish(self, final: str, step: int) -> None:
        self.events.append(("finish", Path(final).name))
        self.versions.append(step)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[RecordingSync]:
    made: list[RecordingSync] = []

    def make(config: TrainingConfig) -> RecordingSync:
        made.append(RecordingSync(config))
        return made[-1]

    monkeypatch.setattr(trainers, "make_weight_sync", make)
    return made


def post_groups(api: ApiProcess, count: int) -> None:
    for index in range(count):
        body = group(size=4, length=8, score=0.0, scores=[1.0, 0.0, 0.5, -1.0][index % 4:] + [0.0] * (index % 4))
        httpx.post(api.url + "/scored_data", json=body).raise_for_status()


def config_for(api: ApiProcess, model: Path, tmp_path: Path, **fields: object) -> TrainingConfig:
    settings: dict[str, object] = dict(
        model_name=str(model), atropos_url=api.url, save_path=str(tmp_path / "checkpoints"),
        log_dir=str(tmp_path / "logs"), training_steps=3, batch_size=2, gradient_accumulation_steps=2,
        seq_len=64, optimizer="adamw", lr=1e-3, device="cpu", vllm_restart_interval=2, checkpoint_interval=0,
        max_prefetch_batches=2)
    settings.update(fields)
    return TrainingConfig(**settings)


def test_the_loop_acks_each_batch_after_its_step_and_syncs_on_schedule(
        api: ApiProcess, tiny_model: Path, tmp_path: Path, recorded: list[RecordingSync]) -> None:
    post_groups(api, 5)
    trainers.train(config_for(api, tiny_model, tmp_path))
    status = httpx.get(api.url + "/status").json()
    assert status["current_step"] == 3
    assert status.get("leased_batches", 0) == 0  # the prefetched batch went back to the queue
    checkpoints = tmp_path / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == ["final_model", "step_2", "step_3"]
    assert recorded[0].events == [("start", str(tiny_model)), ("publish", "step_2"), ("finish", "final_model")]
    assert recorded[0].versions == [0, 2, 3]  # the policy version each served set of weights is reported as
    state = json.loads((checkpoints / "step_2" / "trainer_state.json").read_text())
    assert state["step"] == 2
    # a checkpoint written only for vLLM (no --checkpoint-interval) holds the weights, not the optimizer state
    assert not state["has_optimizer"] and not (checkpoints / "step_2" / "optimizer.pt").exists()
    assert (checkpoints / "final_model" / "optimizer.pt").is_file()
    from safetensors.torch import load_file

    before = load_file(tiny_model / "model.safetensors")
    after = load_file(checkpoints / "final_model" / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_the_lora_modes_serve_adapters_from_the_first_step_to_the_final_one(
        api: ApiProcess, tiny_model: Path, tmp_path: Path, recorded: list[RecordingSync]) -> None:
    post_groups(api, 4)
    trainers.train(config_for(api, tiny_model, tmp_path, weight_bridge_mode="lora_only", lora_r=4,
                              training_steps=2, vllm_restart_interval=1))
    assert recorded[0].events == [("start", str(tmp_path / "checkpoints" / "adapter_step_0")),
                                  ("publish", "adapter_step_1"), ("finish", "final_adapter")]
    checkpoints = tmp_path / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == [
        "adapter_step_0", "adapter_step_1", "adapter_step_2", "final_adapter", "tokenizer"]
    assert (checkpoints / "final_adapter" / "adapter_config.json").exists()
    assert (checkpoints / "tokenizer" / "tokenizer_config.json").exists()
    assert httpx.get(api.url + "/status").json()["current_step"] == 2


def test_resume_continues_from_the_checkpoint_step(api: ApiProcess, tiny_model: Path, tmp_path: Path,
                                                   recorded: list[RecordingSync]) -> None:
    post_groups(api, 4)
    trainers.train(config_for(api, tiny_model, tmp_path, training_steps=2, vllm_restart_interval=1))
    with ApiProcess(tmp_path / "state2", "--no-registration-gate") as fresh:
        post_groups(fresh, 2)
        resumed = config_for(fresh, tiny_model, tmp_path, resume_from=str(tmp_path / "checkpoints" / "step_2"))
        trainers.train(resumed)
        assert httpx.get(fresh.url + "/status").json()["current_step"] == 3
    assert recorded[-1].events == [("start", str(tmp_path / "checkpoints" / "step_2")), ("finish", "final_model")]
    assert recorded[-1].versions == [2, 3]
    assert json.loads((tmp_path / "checkpoints" / "step_3" / "trainer_state.json").read_text())["step"] == 3


def test_on_a_cpu_the_trainers_vllm_starts_while_its_model_loads(api: ApiProcess, tiny_model: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    post_groups(api, 2)
    pids = tmp_path / "pids"
    monkeypatch.setenv("STAND_IN_PIDS", str(pids))
    load, running_at_load = trainers.load_model_and_tokenizer, []

    def load_watching_vllm(config: TrainingConfig) -> Any:
        running_at_load.extend(recorded_pids(pids, 2, timeout=60))  # the stand-in server and its 'engine' child
        return load(config)

    monkeypatch.setattr(trainers, "load_model_and_tokenizer", load_watching_vllm)
    trainers.train(config_for(api, tiny_model, tmp_path, training_steps=1, weight_bridge_mode="reload",
                              vllm_port=free_port(), vllm_python=str(stand_in_runtime(tmp_path).python)))
    assert len(running_at_load) == 2 and recorded_pids(pids, 2) == running_at_load  # that server, started once
    all_gone(running_at_load)


def test_recovery_checkpoints_keep_the_optimizer_state_and_weights_only_ones_warn_on_resume(
        api: ApiProcess, tiny_model: Path, tmp_path: Path, recorded: list[RecordingSync],
        capsys: pytest.CaptureFixture[str]) -> None:
    post_groups(api, 6)
    trainers.train(config_for(api, tiny_model, tmp_path, training_steps=4, vllm_restart_interval=1,
                              checkpoint_interval=2))
    checkpoints = tmp_path / "checkpoints"
    with_optimizer = {name for name in ("step_1", "step_2", "step_3", "step_4", "final_model")
                      if (checkpoints / name / "optimizer.pt").is_file()}
    assert with_optimizer == {"step_2", "step_4", "final_model"}
    with ApiProcess(tmp_path / "state2", "--no-registration-gate") as fresh:
        post_groups(fresh, 2)
        trainers.train(config_for(fresh, tiny_model, tmp_path / "again", training_steps=5,
                                  resume_from=str(checkpoints / "step_3")))
    assert "holds weights only" in capsys.readouterr().out


def post_versioned_groups(api: ApiProcess, versions: list[int]) -> None:
    for version in versions:
        body = group(size=4, length=8, score=0.0, scores=[1.0, 0.0, 0.5, -1.0])
        body["generation_params"] = {"temperature": 0.7, "policy_version": version}
        httpx.post(api.url + "/scored_data", json=body).raise_for_status()


def test_each_step_logs_the_staleness_of_its_batch_and_the_api_drops_what_is_too_old(
        api: ApiProcess, tiny_model: Path, tmp_path: Path, recorded: list[RecordingSync],
        capsys: pytest.CaptureFixture[str]) -> None:
    # batches of one group: step 0 trains a version-0 group; at step 1 the other version-0 group is one step
    # stale, over the bound 0, and the API drops it and serves a version-1 group instead
    post_versioned_groups(api, [0, 0, 1, 1])
    config = config_for(api, tiny_model, tmp_path, gradient_accumulation_steps=2, batch_size=2,
                        training_steps=2, max_staleness=0, max_prefetch_batches=1)
    trainers.train(config)
    out = capsys.readouterr().out
    assert "staleness bound 0 steps" in out
    assert "step 1 |" in out and "staleness 0.0 (max 0)" in out
    status = httpx.get(api.url + "/status").json()
    assert status["max_staleness"] == 0
    assert status["dropped_groups"].get("stale", 0) >= 1  # version-0 groups could not train at step 1


def test_staleness_metrics_count_unknown_groups() -> None:
    from example_trainer.data import prepare_batch

    batch = prepare_batch([group(size=2, length=4, scores=[1.0, 0.0]) | {"generation_params": {"policy_version": 1}},
                           group(size=2, length=4, scores=[1.0, 0.0])], 8)
    assert trainers.staleness_metrics(batch, step=4) == {"staleness/unknown_groups": 1, "staleness/mean": 3.0,
                                                         "staleness/max": 3}


def test_a_run_registered_with_another_batch_size_stops_the_trainer_unless_replaced(
        api: ApiProcess, tiny_model: Path, tmp_path: Path, recorded: list[RecordingSync]) -> None:
    first = config_for(api, tiny_model, tmp_path, gradient_accumulation_steps=4)
    trainers.register(first, 0)
    second = config_for(api, tiny_model, tmp_path, seq_len=32)
    with pytest.raises(trainers.RegistrationMismatchError) as error:
        trainers.register(second, 0)
    message = str(error.value)
    assert "batch_size 8 (this trainer: 4)" in message and "max_token_len 64 (this trainer: 32)" in message
    assert "--replace-run" in message
    trainers.register(second.model_copy(update={"replace_run": True}), 0)
    assert httpx.get(api.url + "/info").json() == {"batch_size": 4, "max_token_len": 32}



def test_a_trainer_against_a_restarted_api_holding_a_later_step_refuses_or_resumes(
        tiny_model: Path, tmp_path: Path, recorded: list[RecordingSync]) -> None:
    api = ApiProcess(tmp_path / "state", "--no-registration-gate")
    with api:
        post_groups(api, 3)
        trainers.train(config_for(api, tiny_model, tmp_path, training_steps=2, vllm_restart_interval=1,
                                  checkpoint_interval=1))
    with ApiProcess(tmp_path / "state", "--no-registration-gate", port=api.port) as restarted:  # state restored
        assert httpx.get(restarted.url + "/status").json()["current_step"] == 2
        post_groups(restarted, 2)
        again = config_for(restarted, tiny_model, tmp_path, training_steps=3, vllm_restart_interval=1)
        with pytest.raises(trainers.RegistrationMismatchError) as error:
            trainers.train(again)
        message = str(error.value)
        assert "holds a run at step 2 and this trainer starts at step 0" in message
        assert f"--resume-from {tmp_path / 'checkpoints' / 'step_2'}" in message
        assert "--replace-run" in message and "--fresh" in message
        trainers.train(again.model_copy(update={"resume_from": str(tmp_path / "checkpoints" / "step_2")}))
        assert httpx.get(restarted.url + "/status").json()["current_step"] == 3
        trainers.train(again.model_copy(update={"replace_run": True, "training_steps": 1,
                                                "save_path": str(tmp_path / "other")}))
        assert httpx.get(restarted.url + "/status").json()["current_step"] == 1


def test_training_rides_out_a_restart_of_run_api(api: ApiProcess, tiny_model: Path, tmp_path: Path,
                                                recorded: list[RecordingSync], monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from atroposlib import trainer_api

    monkeypatch.setattr(trainer_api, "RETRY", trainer_api.RetryPolicy(attempts=2, min_wait=0.2, max_wait=0.5))
    post_groups(api, 5)
    restarts: list[threading.Thread] = []

    def restart_api_once(checkpoint: str, step: int) -> float:
        """After step 1's checkpoint, before its ack: run-api stops, and is back 3 s later."""
        if not restarts:
            api.stop()
            restarts.append(threading.Thread(target=lambda: (time.sleep(3), api.start())))
            restarts[0].start()
        return 0.0

    monkeypatch.setattr(RecordingSync, "publish", lambda self, checkpoint, step: restart_api_once(checkpoint, step))
    trainers.train(config_for(api, tiny_model, tmp_path, training_steps=3, vllm_restart_interval=1,
                              checkpoint_interval=1))
    restarts[0].join()
    assert "does not answer (ack b-000001)" in capsys.readouterr().out
    status = httpx.get(api.url + "/status").json()
    assert status["current_step"] == 3 and status.get("dropped_groups", {}) == {}
    served = httpx.get(api.url + "/batches/served?since=0").json()["batches"]
    seqs = [json.dumps(item, sort_keys=True) for batch in served for item in batch["batch"]]
    assert len(served) == 3 and len(seqs) == len(set(seqs))  # no group trained twice
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == [
        "final_model", "step_1", "step_2", "step_3"]


def test_a_step_whose_ack_is_refused_leaves_no_checkpoint_to_resume_from(
        api: ApiProcess, tiny_model: Path, tmp_path: Path, recorded: list[RecordingSync],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from example_trainer.api import AtroposApiError, BatchFeed

    post_groups(api, 4)
    acked: list[int] = []
    real_ack = BatchFeed.ack

    def ack(feed: BatchFeed, batch: object) -> int:
        if acked:
            raise AtroposApiError("batch b-000002 was served again in another batch before its ack", 410)
        acked.append(real_ack(feed, batch))
        return acked[-1]

    monkeypatch.setattr(BatchFeed, "ack", ack)
    with pytest.raises(trainers.TrainerError) as error:
        trainers.train(config_for(api, tiny_model, tmp_path, training_steps=3, vllm_restart_interval=1))
    checkpoints = tmp_path / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == ["step_1", "step_2.unacknowledged"]
    assert "set aside as step_2.unacknowledged" in str(error.value)


def test_a_checkpoint_already_at_the_last_step_is_an_error(api: ApiProcess, tiny_model: Path, tmp_path: Path,
                                                           recorded: list[RecordingSync]) -> None:
    post_groups(api, 2)
    trainers.train(config_for(api, tiny_model, tmp_path, training_steps=1))
    done = config_for(api, tiny_model, tmp_path, training_steps=1,
                      resume_from=str(tmp_path / "checkpoints" / "step_1"))
    with pytest.raises(trainers.TrainerError, match="already at --training-steps 1"):
        trainers.train(done)


def test_shared_vllm_without_a_gpu_exits_2_with_one_line(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from example_trainer.grpo import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as stopped:
        main(["--model-name", str(tiny_model), "--weight-bridge-mode", "shared_vllm", "--device", "cpu"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


@pytest.mark.parametrize(("signum", "mode"), [(signal.SIGTERM, "reload"), (signal.SIGINT, "reload"),
                                             (signal.SIGTERM, "none")])
def test_a_stop_signal_ends_the_trainer_and_its_vllm(api: ApiProcess, tiny_model: Path, tmp_path: Path,
                                                     signum: int, mode: str) -> None:
    pids = tmp_path / "pids"
    command = [sys.executable, "-u", "-m", "example_trainer.grpo",
               *readme_arguments("console-tools", "atropos-grpo", MODEL=str(tiny_model)),  # reload mode
               "--weight-bridge-mode", mode,  # none: restarts, each server forked from a fork server
               "--device", "cpu", "--optimizer", "adamw", "--atropos-url", api.url, "--vllm-port", str(free_port()),
               "--vllm-python", str(stand_in_runtime(tmp_path).python), "--save-path", str(tmp_path / "checkpoints"),
               "--log-dir", str(tmp_path / "logs")]
    trainer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "STAND_IN_PIDS": str(pids)})
    with killed_at_exit(trainer):
        assert trainer.stdout is not None
        for line in trainer.stdout:  # no environment runs: the trainer waits for batches, vLLM up
            if line.startswith("vLLM ready"):
                break
        vllm_pids = recorded_pids(pids, 2)  # the server and its 'engine' child
        started = _children(trainer.pid)  # the server, or in mode none the fork server
        assert started
        trainer.send_signal(signum)
        assert trainer.wait(60) == 128 + signum
    all_gone(vllm_pids + started)


def _children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if parent_of(int(stat.parent.name)) == pid:
                children.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return children


def test_wandb_gets_atropos_metric_names_offline_without_a_key(api: ApiProcess, tiny_model: Path, tmp_path: Path,
                                                               recorded: list[RecordingSync]) -> None:
    post_groups(api, 2)
    command = [sys.executable, "-c", "import sys; from example_trainer.grpo import main; main(sys.argv[1:])",
               "--model-name", str(tiny_model), "--device", "cpu", "--optimizer", "adamw", "--training-steps", "1",
               "--batch-size", "2", "--gradient-accumulation-steps", "2", "--atropos-url", api.url,
               "--vllm-python", str(stand_in_runtime(tmp_path).python), "--vllm-port", str(free_port()),
               "--save-path", str(tmp_path / "checkpoints"), "--log-dir", str(tmp_path / "logs"),
               "--use-wandb", "--wandb-project", "trainer-test"]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    environment.update(WANDB_DIR=str(tmp_path), WANDB_SILENT="true", STAND_IN_PIDS=str(tmp_path / "pids"))
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_file,) = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    logged = run_file.read_bytes()  # protobuf records keep metric names as plain bytes
    for name in (b"train/loss", b"train/grad_norm", b"train/lr", b"grpo/mean_ratio", b"grpo/clipped_fraction",
                 b"train/step_time", b"train/data_fetch_time", b"train/batch_mean_score"):
        assert name in logged, name


def test_a_missing_model_folder_or_api_fails_in_one_line_before_loading(tiny_model: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from example_trainer.api import check_atropos_api

    monkeypatch.setattr(trainers, "check_atropos_api", lambda url: check_atropos_api(url, timeout=0.5))
    missing = config_for_url("http://127.0.0.1:1", tmp_path / "no-model", tmp_path)
    with pytest.raises(trainers.TrainerError, match="no model folder at"):
        trainers.train(missing)
    with pytest.raises(trainers.TrainerError, match="no trajectory API answers at http://127.0.0.1:1"):
        trainers.train(config_for_url("http://127.0.0.1:1", tiny_model, tmp_path))


def test_a_busy_vllm_port_stops_the_trainer_before_it_registers(api: ApiProcess, tiny_model: Path,
                                                                 tmp_path: Path) -> None:
    import socket

    from example_trainer.vllm_manager import PortInUseError

    with socket.create_server(("127.0.0.1", 0)) as busy:
        config = config_for(api, tiny_model, tmp_path, vllm_port=busy.getsockname()[1],
                            vllm_python=str(stand_in_runtime(tmp_path).python))
        with pytest.raises(PortInUseError, match=f"--vllm-port {config.vllm_port} is already in use"):
            trainers.train(config)
    assert httpx.get(api.url + "/info").json()["batch_size"] == -1


def config_for_url(url: str, model: Path, tmp_path: Path) -> TrainingConfig:
    return TrainingConfig(model_name=str(model), atropos_url=url, save_path=str(tmp_path / "checkpoints"),
                          device="cpu", optimizer="adamw")
