"""The objects a command's imports made, kept out of the garbage collector's scans.

A command imports its libraries once, and what the imports make (modules, classes, functions:
about a million objects once torch and transformers are in) lives as long as the process.
CPython's full collections scan all of them again during the run, and once more as the
interpreter exits: 1-1.5 s of a 2-core CPU for the trainer after its work is done. Called once
a command's imports are done, `freeze_imports` moves them to the collector's permanent
generation (`gc.freeze`): reference counting still frees them, and only a cycle among them is
left to the end of the process. Objects made afterwards are collected as before. Commands
freeze only when run as commands, never when a program calls their ``main`` with arguments.
"""

from __future__ import annotations

import gc


def freeze_imports() -> None:
    """Freeze every object alive now (see the module docstring)."""
    gc.freeze()
