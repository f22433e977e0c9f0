"""Slurm discovery of inference servers, against the real ``scontrol show hostnames``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.envs.server_handling import slurm
from atroposlib.envs.server_handling.configs import APIServerConfig, ServerBaseline
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.slurm import SlurmDiscoveryError, job_hostnames, slurm_inference_urls
from tests.doc_blocks import ROOT, doc_block

pytestmark = pytest.mark.usefixtures("scontrol")


@pytest.mark.parametrize("nodelist, hosts", [
    ("node[01-03]", ["node01", "node02", "node03"]),
    ("gpu-[1-2],cpu7", ["gpu-1", "gpu-2", "cpu7"]),
    ("a,b", ["a", "b"]),
    ("rack[1-2]-gpu[3-4]", ["rack1-gpu3", "rack1-gpu4", "rack2-gpu3", "rack2-gpu4"]),
])
def test_scontrol_expands_node_lists(nodelist: str, hosts: list[str]) -> None:
    assert job_hostnames(nodelist) == hosts


@pytest.mark.parametrize("variables, urls", [
    ({"SLURM_JOB_NODELIST": "node[01-03]", "NUM_TRAINING_NODES": "1", "INFER_TP": "4"},
     ["http://node02:9000/v1", "http://node02:9001/v1", "http://node03:9000/v1", "http://node03:9001/v1"]),
    ({"SLURM_JOB_NODELIST": "gpu-[1-2],cpu7", "NUM_TRAINING_NODES": "2", "INFER_TP": "8"}, ["http://cpu7:9000/v1"]),
    ({"SLURM_JOB_NODELIST": "a,b", "NUM_TRAINING_NODES": "0", "INFER_TP": " 2 ", "INFER_FIRST_PORT": "9100"},
     [f"http://{host}:{port}/v1" for host in "ab" for port in range(9100, 9104)]),
    ({"SLURM_JOB_NODELIST": "a,b", "NUM_TRAINING_NODES": "1"}, [f"http://b:{port}/v1" for port in range(9000, 9008)]),
])
def test_urls_follow_the_layout(variables: dict[str, str], urls: list[str]) -> None:
    assert slurm_inference_urls(variables) == urls


def test_unset_training_nodes_means_one_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="atroposlib.inference"):
        urls = slurm_inference_urls({"SLURM_JOB_NODELIST": "node[1-3]", "INFER_TP": "8"})
    assert urls == ["http://node2:9000/v1", "http://node3:9000/v1"]
    assert "NUM_TRAINING_NODES is not set: assuming 1 training node" in caplog.text


@pytest.mark.parametrize("variable, value, message", [
    ("INFER_TP", "abc", "INFER_TP='abc' is not a whole number (GPUs per inference server)"),
    ("INFER_TP", "0", "INFER_TP=0 does not divide a node's 8 GPUs: use 1, 2, 4 or 8"),
    ("INFER_TP", "3", "INFER_TP=3 does not divide a node's 8 GPUs: use 1, 2, 4 or 8"),
    ("INFER_TP", "16", "INFER_TP=16 does not divide a node's 8 GPUs"),
    ("INFER_TP", "2.0", "INFER_TP='2.0' is not a whole number"),
    ("NUM_TRAINING_NODES", "one", "NUM_TRAINING_NODES='one' is not a whole number"),
    ("NUM_TRAINING_NODES", "3", "NUM_TRAINING_NODES=3 does not fit the job's 3 nodes (node1, node2, node3): "
                                "use 0 to 2 (leading nodes kept for the trainer"),
    ("NUM_TRAINING_NODES", "-1", "NUM_TRAINING_NODES=-1 does not fit the job's 3 nodes"),
    ("INFER_FIRST_PORT", "http", "INFER_FIRST_PORT='http' is not a whole number"),
    ("INFER_FIRST_PORT", "65530", "INFER_FIRST_PORT=65530 is not a port that leaves room for 8 servers"),
])
def test_a_bad_value_is_one_line_naming_the_variable(variable: str, value: str, message: str) -> None:
    variables = {"SLURM_JOB_NODELIST": "node[1-3]", "NUM_TRAINING_NODES": "1", variable: value}
    with pytest.raises(SlurmDiscoveryError) as caught:
        slurm_inference_urls(variables)
    assert str(caught.value).startswith(message)
    error = caught.value
    assert "\n" not in str(error) and error.__cause__ is None  # no int() traceback chained to it
    assert error.__context__ is None or error.__suppress_context__


def test_a_single_host_or_no_job_keeps_the_configured_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert slurm_inference_urls({"SLURM_JOB_NODELIST": "solo", "INFER_TP": "abc"}) == []
    assert slurm_inference_urls({}) == []
    monkeypatch.setenv("SLURM_JOB_NODELIST", "solo")
    configured = APIServerConfig(base_url="http://solo:9000/v1", model_name="m", api_key="k")
    assert [s.config for s in ServerManager([configured], slurm=True).servers] == [configured]
    baseline = ServerManager(ServerBaseline(model_name="m"), slurm=True)
    assert [s.config.base_url for s in baseline.servers] == [f"http://localhost:{p}/v1" for p in range(9004, 9008)]


def test_slurm_true_gives_every_discovered_server_the_configured_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"SLURM_JOB_NODELIST": "node[01-03]", "NUM_TRAINING_NODES": "1", "INFER_TP": "4"}.items():
        monkeypatch.setenv(name, value)
    urls = ["http://node02:9000/v1", "http://node02:9001/v1", "http://node03:9000/v1", "http://node03:9001/v1"]
    first = APIServerConfig(base_url="http://ignored:1/v1", model_name="m", api_key="k", timeout=7,
                            tokenizer_name="tok")
    configs = [s.config for s in ServerManager([first, APIServerConfig(model_name="other")], slurm=True).servers]
    assert configs == [first.model_copy(update={"base_url": url}) for url in urls]
    assert [s.config for s in ServerManager(first, slurm=True).servers] == configs
    baseline = ServerBaseline(model_name="m", timeout=7, num_max_requests_at_once=3, tokenizer_name="tok")
    discovered = [s.config for s in ServerManager(baseline, slurm=True).servers]
    assert discovered == [APIServerConfig(**baseline.model_dump(), base_url=url, api_key="x") for url in urls]


def test_without_slurm_no_variable_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"SLURM_JOB_NODELIST": "node[1-3]", "NUM_TRAINING_NODES": "x", "INFER_TP": "abc"}.items():
        monkeypatch.setenv(name, value)

    def never(nodelist: str) -> list[str]:
        raise AssertionError("scontrol was run although slurm=False")

    monkeypatch.setattr(slurm, "job_hostnames", never)
    configured = APIServerConfig(base_url="http://here:1/v1", model_name="m")
    assert [s.config for s in ServerManager([configured]).servers] == [configured]
    baseline = ServerManager(ServerBaseline())
    assert [s.config.base_url for s in baseline.servers] == [f"http://localhost:{p}/v1" for p in range(9004, 9008)]


def test_scontrol_missing_or_failing_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    job = {"SLURM_JOB_NODELIST": "node[1-3]"}
    broken = tmp_path / "no-controller.conf"
    broken.write_text("ClusterName=broken\n")
    monkeypatch.setenv("SLURM_CONF", str(broken))
    with pytest.raises(SlurmDiscoveryError, match=r"^scontrol show hostnames 'node\[1-3\]' failed: scontrol: fatal: "):
        slurm_inference_urls(job)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmDiscoveryError, match="^SLURM_JOB_NODELIST is set but scontrol is not on PATH"):
        slurm_inference_urls(job)


def test_an_environment_reports_a_bad_variable_and_exits_2(scontrol: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    environment = {**os.environ, "SLURM_JOB_NODELIST": "node[1-3]", "NUM_TRAINING_NODES": "1", "INFER_TP": "3",
                   "WANDB_MODE": "disabled"}
    command = [sys.executable, str(ROOT / "environments" / "arithmetic_env.py"), "process", "--slurm", "true",
               "--env.tokenizer_name", str(tokenizer_dir), "--env.data_path_to_save_groups", str(tmp_path / "g.jsonl")]
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "arithmetic_env.py: --slurm: INFER_TP=3 does not divide a node's 8 GPUs: use 1, 2, 4 or 8 "
        "(GPUs per inference server; 8 // INFER_TP servers per node)")
    assert "Traceback" not in result.stderr


def test_the_documented_hostnames_command_prints_the_documented_hosts(scontrol: Path) -> None:
    shown = subprocess.run(["bash", "-c", doc_block("SLURM.md", "hostnames")], capture_output=True, text=True,
                           check=True)
    assert shown.stdout == doc_block("SLURM.md", "hostnames-output")


def test_the_documented_discovery_example_prints_the_documented_urls(scontrol: Path) -> None:
    shown = subprocess.run([sys.executable, "-c", doc_block("SLURM.md", "discovery")], capture_output=True,
                           text=True, check=True)
    assert shown.stdout == doc_block("SLURM.md", "discovery-output")
