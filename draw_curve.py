#!/usr/bin/env python3
"""Plot loss and accuracy of one or more runs into PNG files (`bfp plot` does the same).

    python draw_curve.py runs/ResNet18_CIFAR100_fp32_* runs/ResNet18_CIFAR100_ResNet18_FB16_* -o curves/
    python draw_curve.py runs/<one-run> --log-loss   # into the run directory, loss on a log scale
"""
import sys

from bfp.cli.plot import main

if __name__ == "__main__":
    sys.exit(main())
