"""The ``--help`` formatter of the training scripts: one default per flag, never ``None``.

argparse's ``ArgumentDefaultsHelpFormatter`` appends ``(default: X)`` to every
help string. Two cases make that wrong: a flag whose help already says what
its default is (``--training-epochs``: "default: 4 for digits, 200
otherwise"), which then showed two defaults, and a ``None`` default that
means "derived" or "off" (``-dp``, ``--run-name``, ``--config-out``), which
showed a meaningless ``(default: None)``. This formatter leaves both alone and
appends the default everywhere else, as before.
"""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or "(default" in text:
            return text
        return super()._get_help_string(action)
