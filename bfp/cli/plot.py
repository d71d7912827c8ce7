"""``draw_curve.py`` / ``bfp plot``: loss and accuracy curves of runs as PNG files."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from ..diagnostics import sqnr_curve
from ..engine.plots import MULTI_RUN_OUT, default_out_dir, draw_curves
from .param_flags import as_flags


def main(argv: Optional[Sequence[str]] = None, prog: str = "draw_curve.py") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Plot loss and accuracy of one or more runs "
                                                       "into PNG files (loss.png, accuracy.png).")
    p.add_argument("runs", nargs="+", help="run directories (written with --log True)")
    p.add_argument("-o", "--out", default=None,
                   help=f"output directory (default: the run directory for one run, {MULTI_RUN_OUT}/ for "
                        f"several)")
    p.add_argument("--labels", nargs="+", default=(), help="legend label per run (default: directory names)")
    p.add_argument("--log-loss", action="store_true",
                   help="loss on a log scale (an early spike no longer flattens the rest)")
    p.add_argument("--sqnr", metavar="LAYER", default=None,
                   help="also plot LAYER's SQNR per quantization point over training (sqnr-LAYER.png) from "
                        "the runs' diagnostics.csv (train with --diagnose N)")
    args = p.parse_args(argv)
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"{prog}: error: -o {args.out} is a file; -o names the folder the PNG files go to", file=sys.stderr)
        return 2
    try:
        for path in draw_curves(args.runs, args.out, args.labels, log_loss=args.log_loss):
            print(f"wrote {path}")
        if args.sqnr:
            out = args.out or default_out_dir(args.runs)
            print(f"wrote {sqnr_curve(args.runs, args.sqnr, out, args.labels)}")
    except (FileNotFoundError, ValueError) as e:
        print(f"{prog}: error: {as_flags(str(e), {'diagnose', 'log'})}", file=sys.stderr)
        return 2
    except OSError as e:  # a folder that cannot be made or written
        print(f"{prog}: error: cannot write the plots to {args.out or 'the run folder'}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    return 0
