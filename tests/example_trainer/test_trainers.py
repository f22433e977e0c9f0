"""The training loop against a real `run-api`, on a tiny model, with vLLM replaced by a
recording stand-in: batches acknowledged after their step, syncs and checkpoints on
schedule, resume continues the step count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from example_trainer import trainers
from example_trainer.config import TrainingConfig
from example_trainer.model import LORA_MODES
from example_trainer.weight_sync import WeightSync
from tests.conftest import group
from tests.doc_commands import readme_arguments
from tests.helpers import ApiProcess, free_port
from tests.local.stand_ins import all_gone, killed_at_exit, recorded_pids, stand_in_runtime

torch = pytest.importorskip("torch")


class RecordingSync(WeightSync):
    """Stands in for vLLM: records the weights it is given."""

    def __init__(self, config: TrainingConfig) -> None:
        super().__init__(config, None)
        self.saves_adapters = config.weight_bridge_mode in LORA_MODES
        self.events: list[tuple[str, str]] = []

    def start(self, weights: str) -> float:
        self.events.append(("start", weights))
        return 0.0

    def publish(self, checkpoint: str, step: int) -> float:
        self.events.append(("publish", Path(checkpoint).name))
        return 0.0

    def finish(self, final: str) -> None:
        self.events.append(("finish", Path(final).name))


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
    state = json.loads((checkpoints / "step_2" / "trainer_state.json").read_text())
    assert state["step"] == 2
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
    assert json.loads((tmp_path / "checkpoints" / "step_3" / "trainer_state.json").read_text())["step"] == 3


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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_the_trainer_and_its_vllm(api: ApiProcess, tiny_model: Path, tmp_path: Path,
                                                     signum: int) -> None:
    pids = tmp_path / "pids"
    command = [sys.executable, "-u", "-m", "example_trainer.grpo",
               *readme_arguments("console-tools", "atropos-grpo", MODEL=str(tiny_model)),  # reload mode
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
        trainer.send_signal(signum)
        assert trainer.wait(60) == 128 + signum
    all_gone(vllm_pids)


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


def config_for_url(url: str, model: Path, tmp_path: Path) -> TrainingConfig:
    return TrainingConfig(model_name=str(model), atropos_url=url, save_path=str(tmp_path / "checkpoints"),
                          device="cpu", optimizer="adamw")
