"""The flag that lets a resume continue on changed data (``bfp.cli.resume_checks`` uses it)."""
from __future__ import annotations

import argparse


def add_resume_flags(p: argparse.ArgumentParser, b: dict) -> None:
    g = p.add_argument_group("resume")
    g.add_argument("--resume-allow-data-change", **b, default=False,
                   help="let --resume continue on a dataset whose fingerprint (classes, image counts, "
                        "sizes) differs from the one the checkpoint recorded; the class count must "
                        "still match")
