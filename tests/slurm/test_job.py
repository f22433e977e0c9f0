"""The example Slurm job (examples/slurm/atropos.sbatch) on a real one-node Slurm cluster:
run-api, the arithmetic environment in ``serve --slurm true`` mode, a scripted inference
server (tests/fake_openai.py) and atropos-sft-gen, submitted with sbatch exactly as SLURM.md
shows it; and the same job with atropos-grpo on a tiny model, giving each checkpoint to the
inference server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from atroposlib.envs.server_handling import slurm
from tests.doc_blocks import ROOT, doc_block
from tests.doc_commands import block_environment, mirror_of_repository
from tests.example_trainer.tiny_model import build_tiny_model
from tests.helpers import free_port
from tests.slurm.cluster import SingleNodeCluster, slurm_missing_reason, submitted_job_id

pytestmark = pytest.mark.slow
# A guard against a hung job, not a speed check: the two-rank trainer job took 36 s on an idle
# 2-core machine and more than 120 s on one running the other tests' workers beside it.
JOB_TIMEOUT_S = 480


def test_the_documentation_shows_the_job_scripts_as_they_are() -> None:
    assert doc_block("SLURM.md", "atropos-sbatch") == (ROOT / "examples/slurm/atropos.sbatch").read_text()
    assert doc_block("SLURM.md", "inference-node-sh") == (ROOT / "examples/slurm/inference-node.sh").read_text()


def test_every_variable_the_scripts_and_discovery_read_is_documented() -> None:
    scripts = "".join((ROOT / "examples/slurm" / name).read_text() for name in ("atropos.sbatch", "inference-node.sh"))
    read = set(re.findall(r"\$\{(\w+):[-?]", scripts)) | {
        value for name, value in vars(slurm).items() if name.endswith("_VARIABLE")}
    documented = set(re.findall(r"^\| `(\w+)` \|", (ROOT / "SLURM.md").read_text(), re.MULTILINE))
    assert read - {"CUDA_VISIBLE_DEVICES", "SLURMD_NODENAME"} <= documented
    assert {"SLURM_JOB_NODELIST", "NUM_TRAINING_NODES", "INFER_TP", "INFER_FIRST_PORT", "ATROPOS_API_KEY"} <= read


@pytest.fixture(scope="module")
def cluster() -> Iterator[SingleNodeCluster]:
    if os.geteuid() != 0:
        pytest.skip("a Slurm test cluster runs slurmctld and slurmd as root: run the tests as root")
    reason = slurm_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with SingleNodeCluster() as started:
        yield started


class Submission:
    """A job submitted from a mirror of the repository in a temporary folder, with free ports
    and every output (job log, RUN_DIR, API state) in that folder."""

    def __init__(self, cluster: SingleNodeCluster, folder: Path, tokenizer_dir: Path) -> None:
        self.cluster = cluster
        self.cwd = mirror_of_repository(folder / "clone")
        self.run_dir = folder / "run"
        self.output = folder / "job.out"
        self.api_port, self.infer_port = free_port(), free_port()
        self.environment = block_environment(
            folder, SLURM_CONF=str(cluster.conf), TOKENIZER=str(tokenizer_dir), RUN_DIR=str(self.run_dir),
            STATE_DIR=str(folder / "api-state"), API_PORT=str(self.api_port),
            INFER_FIRST_PORT=str(self.infer_port), SBATCH_OUTPUT=str(self.output))

    def submit(self, script: str) -> dict[str, str]:
        """Run `script` (which calls sbatch) and return the job's fields once it has ended."""
        submitted = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.environment, capture_output=True,
                                   text=True, timeout=60)
        assert submitted.returncode == 0, submitted.stderr
        try:
            return self.cluster.wait_for_job(submitted_job_id(submitted.stdout), JOB_TIMEOUT_S)
        except TimeoutError as late:
            raise TimeoutError(f"{late}; the job's log ends:\n{self.log('job')[-3000:]}") from late

    def log(self, name: str) -> str:
        path = self.output if name == "job" else self.run_dir / f"{name}-localhost.log"
        return path.read_text(errors="replace") if path.exists() else f"(no {path})"

    def leftovers(self) -> list[str]:
        """Processes of the job still running a few seconds after it ended (none expected)."""
        markers = (f":{self.api_port}", f"--port {self.api_port}", f"--port {self.infer_port}", str(self.run_dir))
        deadline = time.monotonic() + 10
        while True:
            table = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
            left = [line for line in table if any(marker in line for marker in markers) and "ps -eo" not in line]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


def test_the_one_node_job_delivers_groups_and_ends_completed(cluster: SingleNodeCluster, tokenizer_dir: Path,
                                                             tmp_path: Path) -> None:
    submission = Submission(cluster, tmp_path, tokenizer_dir)
    job = submission.submit(doc_block("SLURM.md", "one-node"))
    report = "\n".join(f"== {name}\n{submission.log(name)[-2500:]}" for name in ("job", "env", "sft", "api"))
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), report
    rows = [json.loads(line) for line in (submission.run_dir / "sft.jsonl").read_text().splitlines()]
    assert len(rows) >= 16 and all(row["score"] == 1.0 for row in rows)
    assert all("What is" in row["prefix"] and row["completion"].endswith("}<|end|>") for row in rows)
    run = json.loads((submission.run_dir / "sft.jsonl.provenance.json").read_text())["runs"][-1]
    assert run["outcome"] == "complete" and run["counts"]["groups"] >= 6
    assert run["environments"]["groups_by_env_id"] == {"0": run["counts"]["groups"]}
    env_log = submission.log("env")
    assert "the Slurm job has 1 node (localhost): using the configured servers" in env_log
    assert "serve stopped (SIGTERM received)" in env_log and "Traceback" not in env_log
    assert "sft finished: stopping the environments, the API and the inference servers" in submission.log("job")
    assert submission.leftovers() == []


def test_the_trainer_job_trains_on_two_ranks_and_gives_each_checkpoint_to_the_inference_server(
        cluster: SingleNodeCluster, tokenizer_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model = build_tiny_model(tmp_path / "model", tokenizer_dir)
    submission = Submission(cluster, tmp_path, tokenizer_dir)
    # the scripted server stands in for the bundled one: it wants the job's inference key and takes /reload_weights
    job = submission.submit(
        "INFER_TP=8 INFER_COMMAND='python -m tests.fake_openai --port $PORT --api-key \"$ATROPOS_INFERENCE_API_KEY\"' "
        f"ENV_SCRIPTS=environments/arithmetic_env.py MODEL={model} GROUP_SIZE=4 TRAINING_STEPS=2 "
        f"TRAINER_PROCS_PER_NODE=2 TRAINER_PORT={free_port()} "
        "CONSUMER_FLAGS='--device cpu --optimizer adamw --batch-size 2 --gradient-accumulation-steps 2 "
        "--seq-len 256 --vllm-restart-interval 1' sbatch --nodes=1 examples/slurm/atropos.sbatch")
    report = "\n".join(f"== {name}\n{submission.log(name)[-2500:]}" for name in ("job", "env", "trainer", "api"))
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), report
    checkpoints = submission.run_dir / "checkpoints"
    server_log = (submission.run_dir / f"server-localhost-{submission.infer_port}.log").read_text()
    assert [line for line in server_log.splitlines() if line.startswith("reloaded")] == [
        f"reloaded weights from {checkpoints / 'step_1'}", f"reloaded weights from {checkpoints / 'final_model'}"]
    trainer_log = submission.log("trainer")
    assert "vLLM: the Slurm job's inference servers" in trainer_log and "vllm.log" not in trainer_log
    assert "2 processes (ddp)" in trainer_log
    assert f"inference servers taking the weights (1): http://localhost:{submission.infer_port}" in trainer_log
    assert "trainer finished: stopping the environments" in submission.log("job")
    assert submission.leftovers() == []


def test_a_job_whose_environments_all_stop_fails_at_once(cluster: SingleNodeCluster, tokenizer_dir: Path,
                                                          tmp_path: Path) -> None:
    submission = Submission(cluster, tmp_path, tokenizer_dir)
    job = submission.submit("INFER_TP=8 INFER_COMMAND='python -m tests.fake_openai --port $PORT' "
                            "ENV_SCRIPTS=environments/no_such_env.py CONSUMER=sft "
                            "sbatch --nodes=1 examples/slurm/atropos.sbatch")
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "1:0"), submission.log("job")
    assert "atropos.sbatch: every environment stopped" in submission.log("job")
    assert submission.leftovers() == []
