#!/usr/bin/env python3
"""Train a CIFAR-sized image classifier with simulated low-precision arithmetic.

    python cifar.py --mode train --model ResNet18 --dataset CIFAR100 --log True --bfp ResNet18_FB24
    python cifar.py --dataset digits --bfp ResNet18_FB16 --compare True   # offline, a few minutes

Everything lives in bfp.engine (flags: bfp/engine/cli.py); `--help` lists the flags.
"""
import sys

from bfp.engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
