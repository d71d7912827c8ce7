#!/usr/bin/env python3
"""Plot loss and accuracy of one or more runs into PNG files.

    python draw_curve.py runs/ResNet18_CIFAR100_fp32_* runs/ResNet18_CIFAR100_ResNet18_FB16_* -o curves/
"""
import argparse
import sys

from bfp.engine.plots import draw_curves


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="draw_curve.py", description=__doc__.splitlines()[1])
    p.add_argument("runs", nargs="+", help="run directories (written with --log True)")
    p.add_argument("-o", "--out", default="curves", help="output directory for loss.png and accuracy.png")
    p.add_argument("--labels", nargs="+", default=(), help="legend label per run (default: directory names)")
    args = p.parse_args(argv)
    try:
        for path in draw_curves(args.runs, args.out, args.labels):
            print(f"wrote {path}")
    except (FileNotFoundError, ValueError) as e:
        print(f"draw_curve.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
