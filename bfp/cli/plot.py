"""``draw_curve.py`` / ``bfp plot``: loss and accuracy curves of runs as PNG files."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from ..engine.plots import draw_curves


def main(argv: Optional[Sequence[str]] = None, prog: str = "draw_curve.py") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Plot loss and accuracy of one or more runs "
                                                       "into PNG files.")
    p.add_argument("runs", nargs="+", help="run directories (written with --log True)")
    p.add_argument("-o", "--out", default="curves", help="output directory for loss.png and accuracy.png")
    p.add_argument("--labels", nargs="+", default=(), help="legend label per run (default: directory names)")
    args = p.parse_args(argv)
    try:
        for path in draw_curves(args.runs, args.out, args.labels):
            print(f"wrote {path}")
    except (FileNotFoundError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0
