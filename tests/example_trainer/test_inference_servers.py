"""Remote inference servers in ``reload`` mode (``--inference-server-urls``,
``--slurm-inference-servers``): stand-ins of the bundled server on free loopback ports record
what the trainer sends. Each sync checkpoint, then the final one, reaches every server with
the bearer key and no local vLLM starts; unreachable, unsuitable and refusing servers stop
the run in one line naming them; other modes refuse remote servers at parse time."""

from __future__ import annotations

import json
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import httpx
import pytest

from atroposlib.local.vllm_service import LocalVLLM
from example_trainer.cli import parse_config
from example_trainer.config import TrainingConfig
from example_trainer.grpo import main
from example_trainer.inference_servers import API_KEY_ENV, InferenceServerError, InferenceServers, server_root
from example_trainer.weight_sync import RemoteReloadSync
from tests.conftest import group
from tests.helpers import ApiProcess, free_port
from tests.slurm.cluster import slurm_missing_reason, write_client_conf

KEY = "inference-key"


@dataclass
class StandIn:
    """A stand-in of the bundled vLLM server: /health, /bridge/info and /reload_weights
    (which answers `reload_answer`, after `before_reload` returns), wanting `key` when set;
    with `bundled=False` it is a stock vLLM, where only /health exists."""

    key: Optional[str] = None
    bundled: bool = True
    reload_answer: tuple[int, dict[str, Any]] = (200, {"status": "ok", "seconds": 0.1})
    before_reload: Callable[[], None] = lambda: None
    requests: list[tuple[str, str, Optional[str], Any]] = field(default_factory=list)
    url: str = ""

    def answer(self, method: str, path: str, authorization: Optional[str], body: Any) -> tuple[int, dict[str, Any]]:
        self.requests.append((method, path, authorization, body))
        if path == "/health":
            return 200, {}
        if not self.bundled or path not in ("/bridge/info", "/reload_weights"):
            return 404, {"detail": "Not Found"}
        if self.key and authorization != f"Bearer {self.key}":
            return 401, {"detail": "missing or wrong API key"}
        if path == "/bridge/info":
            return 200, {"enabled": False, "model_name": "base"}
        self.before_reload()
        return self.reload_answer

    def reloads(self) -> list[str]:
        return [body["weights_path"] for method, path, _, body in self.requests if path == "/reload_weights"]


@contextmanager
def serving(stand_in: StandIn) -> Iterator[StandIn]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            code, payload = stand_in.answer(method, self.path, self.headers.get("Authorization"), body)
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._reply("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._reply("POST")

        def log_message(self, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    stand_in.url = f"http://127.0.0.1:{http.server_address[1]}"
    try:
        yield stand_in
    finally:
        http.shutdown()
        http.server_close()
        thread.join()


@contextmanager
def serving_all(*stand_ins: StandIn) -> Iterator[tuple[StandIn, ...]]:
    with ExitStack() as stack:
        yield tuple(stack.enter_context(serving(stand_in)) for stand_in in stand_ins)


def nobody_listens() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def no_local_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: LocalVLLM, timeout: float = 0.0) -> LocalVLLM:
        raise AssertionError("the trainer started a vLLM of its own")

    monkeypatch.setattr(LocalVLLM, "start", refuse)


def trainer_flags(api: ApiProcess, model: Path, *servers: str) -> list[str]:
    # --vllm-python names no file: building a local vLLM launcher at all would stop the run
    return ["--model-name", str(model), "--device", "cpu", "--optimizer", "adamw", "--lr", "1e-3",
            "--atropos-url", api.url, "--training-steps", "3", "--vllm-restart-interval", "2",
            "--checkpoint-interval", "0", "--batch-size", "2", "--gradient-accumulation-steps", "2",
            "--seq-len", "64", "--max-prefetch-batches", "2", "--save-path", "checkpoints", "--log-dir", "logs",
            "--vllm-python", "/no/such/python", "--weight-bridge-mode", "reload",
            "--inference-server-urls", *servers]


def test_every_server_gets_each_sync_checkpoint_then_the_final_one_with_the_key(
        api: ApiProcess, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        no_local_vllm: None, capsys: pytest.CaptureFixture[str]) -> None:
    for index in range(4):
        body = group(size=4, length=8, scores=[1.0, 0.0, 0.5, -float(index)])
        httpx.post(api.url + "/scored_data", json=body).raise_for_status()
    monkeypatch.chdir(tmp_path)  # a relative --save-path: the servers are sent absolute folders
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with serving_all(StandIn(key=KEY), StandIn(key=KEY)) as (first, second):
        main(trainer_flags(api, tiny_model, first.url, second.url + "/v1/"))
    checkpoints = tmp_path / "checkpoints"
    for server in (first, second):
        assert server.reloads() == [str(checkpoints / "step_2"), str(checkpoints / "final_model")]
        assert [path for _, path, _, _ in server.requests][:2] == ["/health", "/bridge/info"]  # before training
        assert {authorization for _, path, authorization, _ in server.requests if path != "/health"} == {
            f"Bearer {KEY}"}
    assert httpx.get(api.url + "/status").json()["current_step"] == 3
    printed = capsys.readouterr().out
    assert f"inference servers taking the weights (2): {first.url}, {second.url}" in printed
    assert f"step 2: vLLM now serves {Path('checkpoints') / 'step_2'}" in printed


def test_unready_servers_stop_the_run_in_one_line_before_the_model_loads(
        api: ApiProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # not loadable: a load would fail differently
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    down = nobody_listens()
    with serving_all(StandIn(), StandIn(bundled=False), StandIn(key=KEY)) as (ready, stock, keyed):
        with pytest.raises(SystemExit) as stopped:
            main(trainer_flags(api, tmp_path / "model", ready.url, down, stock.url, keyed.url))
    message = str(stopped.value.code)
    assert message.startswith("error: 3 of 4 inference servers cannot take the trainer's weights: ")
    assert "\n" not in message and ready.url + ":" not in message
    assert f"{down}: no answer (" in message
    assert f"{stock.url}: has no weight reload route (404 for /bridge/info)" in message
    assert f"{keyed.url}: wants a key, and {API_KEY_ENV} is unset (401)" in message
    assert "example_trainer/vllm_api_server.py" in message and f"set {API_KEY_ENV}" in message
    assert httpx.get(api.url + "/status").json()["current_step"] == 0  # never registered


def test_reload_posts_to_every_server_at_once_with_the_key(tmp_path: Path) -> None:
    both_asked = threading.Barrier(2, timeout=10)  # one server at a time would break it
    with serving_all(StandIn(key=KEY, before_reload=both_asked.wait),
                     StandIn(key=KEY, before_reload=both_asked.wait)) as (first, second):
        servers = InferenceServers((first.url, second.url), KEY)
        servers.check()
        assert servers.reload(str(tmp_path / "step_3"), policy_version=3) >= 0
    assert first.reloads() == second.reloads() == [str(tmp_path / "step_3")]
    assert [body.get("policy_version") for _, path, _, body in first.requests if path == "/reload_weights"] == [3]


def test_a_server_that_sees_no_checkpoint_folder_is_named_with_the_shared_file_system_hint(tmp_path: Path) -> None:
    folder = str(tmp_path / "step_2")
    unseen = (404, {"detail": f"no weights folder at {folder}"})
    failing = (500, {"detail": "reload failed: shape mismatch\nin layer 3"})
    with serving_all(StandIn(), StandIn(reload_answer=unseen), StandIn(reload_answer=failing)) as (fine, far, broken):
        with pytest.raises(InferenceServerError) as refused:
            InferenceServers((fine.url, far.url, broken.url)).reload(folder, policy_version=2)
    message = str(refused.value)
    assert message.startswith(f"2 of 3 inference servers did not take the weights in {folder}: ")
    assert f"{far.url}: sees no folder {folder}" in message
    assert "the checkpoint folder (--save-path) must be on a file system the inference nodes see" in message
    assert f"{broken.url}: /reload_weights answered 500: reload failed: shape mismatch in layer 3" in message
    assert "\n" not in message and fine.url + ":" not in message


def test_a_wrong_key_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(StandIn(key=KEY)) as server:
        with pytest.raises(InferenceServerError, match=f"refused the key in \\${API_KEY_ENV} \\(401\\)"):
            InferenceServers((server.url,), "not-the-key").check()


def test_a_resumed_run_gives_the_servers_its_checkpoint_first(tmp_path: Path) -> None:
    config = TrainingConfig(model_name="base", weight_bridge_mode="reload", inference_server_urls=["http://h:1"])
    with serving(StandIn()) as server:
        sync = RemoteReloadSync(config, InferenceServers((server.url,)))
        assert sync.start("base", 0) == 0.0
        sync.start(str(tmp_path / "step_4"), 4)
    assert server.reloads() == [str(tmp_path / "step_4")]


@pytest.mark.parametrize("url, root", [
    ("http://gpu02:9000/v1", "http://gpu02:9000"), ("https://h:1/", "https://h:1"),
    ("http://h:9000/prefix/v1/", "http://h:9000/prefix"), (" http://h ", "http://h"),
])
def test_server_roots(url: str, root: str) -> None:
    assert server_root(url) == root


@pytest.mark.parametrize("flags, message", [
    (["--inference-server-urls", "http://h:9000"], "need --weight-bridge-mode reload (remote servers read each "
                                                   "checkpoint in place); mode none works with a vLLM on this "
                                                   "machine only"),
    (["--slurm-inference-servers", "--weight-bridge-mode", "lora_only"], "mode lora_only works with a vLLM"),
    (["--slurm-inference-servers", "--weight-bridge-mode", "lora_restart"], "mode lora_restart works"),
    (["--weight-bridge-mode", "reload", "--inference-server-urls", "h:9000"],
     "--inference-server-urls: 'h:9000' is not an inference server URL (http://HOST:PORT)"),
    (["--weight-bridge-mode", "reload", "--inference-server-urls", "http://h:70000"], "has no valid port"),
])
def test_remote_servers_outside_reload_mode_or_bad_urls_are_one_line_usage_errors(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_config(["--model", "m", *flags])
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scontrol show hostnames`` works in this test (a client slurm.conf, no daemon)."""
    reason = slurm_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.setenv("SLURM_CONF", str(write_client_conf(tmp_path)))


@pytest.mark.usefixtures("scontrol")
def test_slurm_discovery_gives_the_inference_nodes_servers() -> None:
    config = TrainingConfig(model_name="m", weight_bridge_mode="reload", slurm_inference_servers=True,
                            inference_server_urls=["http://gpu01:9000/v1"])
    job = {"SLURM_JOB_NODELIST": "gpu[01-03]", "NUM_TRAINING_NODES": "1", "INFER_TP": "4", API_KEY_ENV: KEY}
    servers = InferenceServers.from_config(config, job)
    assert servers == InferenceServers(("http://gpu02:9000", "http://gpu02:9001", "http://gpu03:9000",
                                        "http://gpu03:9001"), KEY)
    one_node = InferenceServers.from_config(config, {"SLURM_JOB_NODELIST": "gpu01"})
    assert one_node == InferenceServers(("http://gpu01:9000",))  # the configured servers, as for environments
    with pytest.raises(InferenceServerError, match="^--slurm-inference-servers: INFER_TP=3 does not divide"):
        InferenceServers.from_config(config, {**job, "INFER_TP": "3"})
    alone = TrainingConfig(model_name="m", weight_bridge_mode="reload", slurm_inference_servers=True)
    with pytest.raises(InferenceServerError, match="no inference nodes .* and no --inference-server-urls"):
        InferenceServers.from_config(alone, {})
