"""`atropos-grpo`: train a model with GRPO on batches from the trajectory API.

    atropos-grpo --model-name DIR_OR_HUB_ID --training-steps 20 --weight-bridge-mode reload

Exit status: 0 when training finished, 1 with one ``error:`` line when it could not start or
go on, 2 when the chosen mode needs hardware this machine lacks or the API holds a run whose
batch size, token limit or staleness bound differ (``--replace-run``), 130 / 143 when stopped by
Ctrl-C / SIGTERM (vLLM stopped, unacknowledged batches back in the API's queue).
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from typing import Optional



def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


_MISSING = [name for name in ("torch", "peft", "accelerate") if not _installed(name)]
if _MISSING:  # the trainer extra is not installed: say how to install it rather than fail on an import
    raise SystemExit(f"error: atropos-grpo needs the trainer extra ({', '.join(_MISSING)} not installed): "
                     "pip install 'atroposlib[example-trainer]' (scripts/setup.sh installs torch's CPU build first)")

from atroposlib.local.allocator import AllocatorNotFoundError, restart_with_fast_allocator
from atroposlib.local.gc_freeze import freeze_imports
from atroposlib.local.signals import StopSignal, stop_signals_raise
from example_trainer.cli import parse_config
from example_trainer.config import TrainingConfig


def run_training(config: TrainingConfig, as_command: bool = False) -> None:
    """Run the mode's entry point, turning the ways training can end into an exit status."""
    # torch and transformers load here, after a restart with a faster allocator (`main`)
    from example_trainer.entry_points import (ENTRY_POINTS, STOPPING_ERRORS, GpuRequiredError,
                                              RegistrationMismatchError, train_legacy)

    if as_command:
        freeze_imports()
    entry = ENTRY_POINTS.get(config.weight_bridge_mode, train_legacy)
    try:
        with stop_signals_raise():
            entry(config)
    except (GpuRequiredError, RegistrationMismatchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except STOPPING_ERRORS as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt as stop:
        print(f"{stop or 'interrupted'}: vLLM stopped, unacknowledged batches returned to the API", file=sys.stderr)
        signum = signal.Signals[stop.signal_name] if isinstance(stop, StopSignal) else signal.SIGINT
        sys.exit(128 + signum)


def main(argv: Optional[list[str]] = None) -> None:
    """`atropos-grpo`: `argv` (default: the command line) parsed, then training. Run from the
    command line on a CPU, the trainer first starts itself again with tcmalloc preloaded
    (`atroposlib.local.allocator`); called with `argv` (from a program), it never does."""
    config = parse_config(argv)
    if argv is None:
        try:
            restart_with_fast_allocator(config.cpu_allocator, config.device)
        except AllocatorNotFoundError as exc:
            sys.exit(f"error: {exc}")
    run_training(config, as_command=argv is None)


if __name__ == "__main__":
    main()
