"""atropos-grpo's and atropos-grpo-run's command lines: Atropos's flags and defaults, layer
indices, every flag reaching TrainingConfig, and --help."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

import pytest

from example_trainer.cli import (config_from_args, create_full_parser, create_unified_parser, parse_args,
                                 parse_config, parse_layer_indices)
from example_trainer.config import TrainingConfig
from tests.reference_tests import REFERENCE_PYTHON

# Flags whose default is deliberately not Atropos's: dtype "auto" picks float32 on CPUs
# without AMX; --device is an expression (cuda when available), checked below.
CHANGED_DEFAULTS = {"--dtype": "auto"}
NOT_LITERAL = object()


def reference_cli() -> Path:
    found = sorted(REFERENCE_PYTHON.parent.parent.glob("lib/python*/site-packages/example_trainer/cli.py"))
    if not found:
        pytest.skip(f"the reference wheel is not installed next to {REFERENCE_PYTHON} (bench/setup_reference.sh)")
    return found[0]


def reference_flags(source: str, function: str) -> dict[str, dict[str, Any]]:
    """Option string -> {"default", "choices"} of every add_argument call reachable from `function`
    in the reference's cli.py, read from its syntax tree (importing it needs torch)."""
    tree = ast.parse(source)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    called = [node.func.id for node in ast.walk(functions[function])
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions]
    flags: dict[str, dict[str, Any]] = {}
    for name in called:
        for node in ast.walk(functions[name]):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            keywords = {kw.arg: kw.value for kw in node.keywords}
            store_true = "action" in keywords and ast.literal_eval(keywords["action"]) == "store_true"
            default: Any = False if store_true else None
            if "default" in keywords:
                try:
                    default = ast.literal_eval(keywords["default"])
                except ValueError:
                    default = NOT_LITERAL
            choices = ast.literal_eval(keywords["choices"]) if "choices" in keywords else None
            for option in (arg.value for arg in node.args if isinstance(arg, ast.Constant)):
                flags[option] = {"default": default, "choices": choices}
    return flags


@pytest.mark.parametrize("function,parser_factory", [
    ("create_full_parser", create_full_parser), ("create_unified_parser", create_unified_parser),
])
def test_every_reference_flag_exists_with_the_same_default(function: str, parser_factory: Any) -> None:
    reference = reference_flags(reference_cli().read_text(), function)
    assert len(reference) > 10
    ours = parser_factory()._option_string_actions
    for option, expected in reference.items():
        assert option in ours, f"{option} is missing"
        action = ours[option]
        if expected["default"] is not NOT_LITERAL:
            assert action.default == CHANGED_DEFAULTS.get(option, expected["default"]), option
        if expected["choices"] is not None:
            assert set(expected["choices"]) <= set(action.choices), option


def test_device_defaults_to_cuda_when_available() -> None:
    import torch

    assert parse_args(["--model", "m"]).device == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("value,expected", [
    ("20-31", list(range(20, 32))),
    ("0-3,28-31", [0, 1, 2, 3, 28, 29, 30, 31]),
    ("0,1,2", [0, 1, 2]),
    ("5,1,5,0-2", [0, 1, 2, 5]),
    (" 3 , 1 - 2 ", [1, 2, 3]),
    ("7-7", [7]),
    ("", None),
    (" , ", None),
])
def test_layer_indices(value: str, expected: Any) -> None:
    assert parse_layer_indices(value) == expected


@pytest.mark.parametrize("value,message", [
    ("5-2", "start is after end"), ("a", "expected N or START-END"), ("1.5", "expected N or START-END"),
    ("-1", "indices must be >= 0"), ("1-2-3", "expected N or START-END"), ("1,x", "'x'"),
])
def test_bad_layer_indices_are_argument_errors(value: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_layer_indices(value)


@pytest.mark.parametrize("flag", ["--train-layer-indices", "--lora-layer-indices"])
def test_bad_layer_indices_exit_with_a_usage_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model", "m", flag, "3-1"])
    assert exit_info.value.code == 2
    assert "start is after end" in capsys.readouterr().err


# flag tokens -> (field, value) for every flag of atropos-grpo, each set to a non-default value
EVERY_FLAG = [
    (["--model-name", "org/model"], "model_name", "org/model"),
    (["--lr", "0.001"], "lr", 0.001),
    (["--training-steps", "7"], "training_steps", 7),
    (["--batch-size", "3"], "batch_size", 3),
    (["--seq-len", "256"], "seq_len", 256),
    (["--gradient-accumulation-steps", "5"], "gradient_accumulation_steps", 5),
    (["--warmup-steps", "2"], "warmup_steps", 2),
    (["--optimizer", "adafactor"], "optimizer", "adafactor"),
    (["--adafactor-scale-parameter"], "adafactor_scale_parameter", True),
    (["--adafactor-relative-step"], "adafactor_relative_step", True),
    (["--device", "cpu:0"], "device", "cpu:0"),
    (["--save-path", "ckpts"], "save_path", "ckpts"),
    (["--checkpoint-interval", "0"], "checkpoint_interval", 0),
    (["--resume-from", "ckpts/step_3"], "resume_from", "ckpts/step_3"),
    (["--keep-last-n", "2"], "save_total_limit", 2),
    (["--save-total-limit", "0"], "save_total_limit", 0),
    (["--clip-eps", "0.1"], "clip_eps", 0.1),
    (["--kl-coef", "0.05"], "kl_coef", 0.05),
    (["--use-env-advantages"], "use_env_advantages", True),
    (["--missing-logprobs", "error"], "missing_logprobs", "error"),
    (["--vllm-port", "9100"], "vllm_port", 9100),
    (["--vllm-gpu", "1"], "vllm_gpu", 1),
    (["--vllm-gpu-memory-utilization", "0.3"], "vllm_gpu_memory_utilization", 0.3),
    (["--max-model-len", "1024"], "max_model_len", 1024),
    (["--dtype", "float32"], "dtype", "float32"),
    (["--vllm-restart-interval", "1"], "vllm_restart_interval", 1),
    (["--vllm-stop-during-train"], "vllm_stop_during_train", True),
    (["--vllm-python", "/opt/vllm/bin/python"], "vllm_python", "/opt/vllm/bin/python"),
    (["--atropos-url", "http://api:8001"], "atropos_url", "http://api:8001"),
    (["--max-prefetch-batches", "2"], "max_prefetch_batches", 2),
    (["--lease-seconds", "60"], "lease_seconds", 60.0),
    (["--use-wandb"], "use_wandb", True),
    (["--wandb-project", "proj"], "wandb_project", "proj"),
    (["--wandb-group", "grp"], "wandb_group", "grp"),
    (["--weight-bridge-mode", "reload"], "weight_bridge_mode", "reload"),
    (["--vllm-config-path", "bridge.json"], "vllm_config_path", "bridge.json"),
    (["--train-layer-indices", "0-1"], "train_layer_indices", [0, 1]),
    (["--inference-server-urls", "http://gpu02:9000/v1", "http://gpu02:9001"], "inference_server_urls",
     ["http://gpu02:9000", "http://gpu02:9001"]),
    (["--slurm-inference-servers"], "slurm_inference_servers", True),
    (["--lora-r", "4"], "lora_r", 4),
    (["--lora-alpha", "8"], "lora_alpha", 8),
    (["--lora-dropout", "0.0"], "lora_dropout", 0.0),
    (["--lora-target-modules", "q_proj", "o_proj"], "lora_target_modules", ["q_proj", "o_proj"]),
    (["--lora-layer-indices", "2,4"], "lora_layer_indices", [2, 4]),
    (["--debug-loading"], "debug_loading", True),
    (["--benchmark"], "benchmark", True),
    (["--log-dir", "runlogs"], "log_dir", "runlogs"),
    (["--loss-type", "dapo"], "loss_type", "dapo"),
    (["--epsilon-high", "0.28"], "epsilon_high", 0.28),
    (["--dual-clip", "3"], "dual_clip", 3.0),
    (["--tis-cap", "2"], "tis_cap", 2.0),
    (["--scale-rewards", "none"], "scale_rewards", "none"),
    (["--kl-reference", "model"], "kl_reference", "model"),
    (["--loss-norm-length", "512"], "loss_norm_length", 512),
    (["--no-match-sampler-truncation"], "match_sampler_truncation", False),
    (["--max-staleness", "2"], "max_staleness", 2),
    (["--pad-to-multiple", "8"], "pad_to_multiple", 8),
    (["--no-share-prompt-prefix"], "share_prompt_prefix", False),
    (["--replace-run"], "replace_run", True),
    (["--no-vllm-pause-during-train"], "vllm_pause_during_train", False),
    (["--vllm-dtype", "float32"], "vllm_dtype", "float32"),
    (["--no-vllm-fork-server"], "vllm_fork_server", False),
    (["--gradient-checkpointing"], "gradient_checkpointing", True),
    (["--data-parallel", "fsdp"], "data_parallel", "fsdp"),
    (["--world-size", "2"], "world_size", 2),
    (["--trainer-rank", "1"], "trainer_rank", 1),
    (["--init-method", "tcp://h:1"], "init_method", "tcp://h:1"),
    (["--cpu-allocator", "system"], "cpu_allocator", "system"),
]


def test_every_flag_reaches_the_config() -> None:
    argv = [token for tokens, _, _ in EVERY_FLAG for token in tokens]
    config = config_from_args(parse_args(argv))
    assert {field: getattr(config, field) for _, field, _ in EVERY_FLAG} == {f: v for _, f, v in EVERY_FLAG}
    # every config field is set by some flag, except the deprecated ones (hidden flags)
    hidden = {"num_inference_nodes", "single_copy"}
    assert set(TrainingConfig.model_fields) - {field for _, field, _ in EVERY_FLAG} == hidden


def test_defaults_give_the_configs_defaults() -> None:
    config = config_from_args(parse_args(["--model", "m"]))
    assert config == TrainingConfig(model_name="m", device=config.device)


def test_short_aliases() -> None:
    args = parse_args(["--model", "m", "--gpu-memory-utilization", "0.2"])
    assert args.gpu_memory_utilization == 0.2
    assert config_from_args(args).vllm_gpu_memory_utilization == 0.2


def test_deprecated_flags_are_accepted_but_hidden() -> None:
    assert config_from_args(parse_args(["--model", "m", "--num-inference-nodes", "0"])).num_inference_nodes == 0
    with pytest.warns(DeprecationWarning, match="num_inference_nodes"):
        config_from_args(parse_args(["--model", "m", "--num-inference-nodes", "2"]))
    assert "--num-inference-nodes" not in create_full_parser().format_help()


def test_the_distributed_flags_are_shown_in_their_group() -> None:
    help_text = create_full_parser().format_help()
    for flag in ("Distributed", "--data-parallel", "--world-size", "--trainer-rank", "--init-method", "torchrun"):
        assert flag in help_text


def test_help_shows_every_flag_with_its_default_in_atroposs_groups() -> None:
    parser = create_full_parser()
    help_text = " ".join(parser.format_help().split())
    titles = ["Model:", "Training:", "GRPO:", "vLLM:", "API:", "W&B:", "Mode:", "LoRA:", "Distributed:", "Debug:"]
    positions = [help_text.index(title) for title in titles]
    assert positions == sorted(positions)
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        assert action.option_strings[0] in help_text
        if action.default not in (None, False, argparse.SUPPRESS):
            default = str(action.default)
            assert f"(default: {default})" in help_text, action.option_strings[0]


def test_unified_parser_has_no_mode_lora_or_distributed_flags() -> None:
    options = create_unified_parser()._option_string_actions
    for flag in ("--weight-bridge-mode", "--lora-r", "--train-layer-indices", "--world-size", "--vllm-config-path"):
        assert flag not in options
    args = create_unified_parser().parse_args(["--model", "m", "--lr", "0.01", "--log-dir", "x"])
    config = config_from_args(args)
    assert (config.lr, config.log_dir, config.weight_bridge_mode) == (0.01, "x", "none")


def test_model_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args([])
    assert "--model" in capsys.readouterr().err


def test_invalid_values_are_one_line_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--lr: Input should be greater than 0"):
        config_from_args(parse_args(["--model", "m", "--lr", "-1"]))
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--model", "m", "--batch-size", "0", "--max-prefetch-batches", "0"])
    assert exit_info.value.code == 2
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error_lines) == 1
    assert "--batch-size" in error_lines[0] and "--max-prefetch-batches" in error_lines[0]


def test_parse_config_with_the_unified_parser() -> None:
    config = parse_config(["--model", "m", "--benchmark"], create_unified_parser())
    assert config.benchmark and config.model_name == "m"


def test_without_the_trainer_extra_the_command_says_how_to_install_it() -> None:
    import subprocess
    import sys

    hide_torch = ("import importlib.abc, sys\n"
                  "class Hidden(importlib.abc.MetaPathFinder):\n"
                  "    def find_spec(self, name, path, target=None):\n"
                  "        if name.split('.')[0] == 'torch':\n"
                  "            raise ModuleNotFoundError(name)\n"
                  "sys.meta_path.insert(0, Hidden())\n"
                  "sys.argv = ['atropos-grpo', '--help']\n"
                  "from example_trainer.grpo import main\n")
    result = subprocess.run([sys.executable, "-c", hide_torch], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == ("error: atropos-grpo needs the trainer extra (torch not installed): "
                                     "pip install 'atroposlib[example-trainer]' (scripts/setup.sh installs torch's "
                                     "CPU build first)")
