"""The ``--help`` layout of the local tools: every flag's default shown after its text.

argparse's `ArgumentDefaultsHelpFormatter` would also print ``(default: None)`` for flags
whose default is "absent" and ``(default: False)`` for switches; their help text says
what happens without them instead.
"""

from __future__ import annotations

import argparse
import textwrap


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to each flag's help unless X is None or a switch's False."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action) or ""

    def _split_lines(self, text: str, width: int) -> list[str]:
        # A default path such as /tmp/my-clone/environments/... stays whole: argparse would
        # cut it at its hyphen.
        text = " ".join(text.split())
        return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)
