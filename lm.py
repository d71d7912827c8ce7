#!/usr/bin/env python3
"""Train a character-level language model (a small GPT) with simulated low-precision arithmetic.

    python lm.py                                   # the default corpus (Python stdlib source), FP32
    python lm.py --bfp any_fp8_e4m3 --log True     # FP8 on every GEMM, attention included
    python lm.py --data my.txt --block-size 128

Shares cifar.py's flags and engine (--bfp, -tc, --do, --precision, --loss-scale,
--emulate-node, torchrun, --resume); `--help` lists them. `bfp lm ARGS` does the same.
"""
import sys

from bfp.cli import run_task

if __name__ == "__main__":
    sys.exit(run_task("lm"))
