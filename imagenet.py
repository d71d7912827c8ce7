#!/usr/bin/env python3
"""Train a torchvision ImageNet classifier with simulated low-precision arithmetic.

    python imagenet.py /data/imagenet -a resnet18 --bfp ResNet18_FB12LG24 --log True
    python imagenet.py DIR -a resnet18 --image-size 64 --limit-train-images 512 --epochs 1   # a quick look

DIR holds train/ and val/ class folders. The flags are the PyTorch ImageNet
example's plus cifar.py's (bfp/cli/imagenet_flags.py, bfp/cli/flags.py); the run
is cifar.py's (bfp/cli/run.py); `--help` lists the flags. `bfp imagenet ARGS`
does the same.
"""
import sys

from bfp.cli import run_task

if __name__ == "__main__":
    sys.exit(run_task("imagenet"))
