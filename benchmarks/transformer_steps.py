"""Training-step time of the transformer tables' models (vit-table's ViT, lm-table's GPT) per network config.

    python benchmarks/transformer_steps.py                                   # FP32, H100 fast and promoted
    python benchmarks/transformer_steps.py --configs any_mxfp8 --rounds 5 --json out.json

One step (forward, backward, SGD update) of the ViT of ``vit-table`` (dim 64, depth 4, 2 heads,
a batch of 128 random 32x32 images) and of ``lm-table``'s GPT (its defaults: dim 128, depth 4,
4 heads, 128 windows of 64 tokens), FP32 and each config in turn, alternated in rounds
(``_harness.alternate``); the table gives the median step and its ratio to FP32 measured in the
same run. Run it against another checkout with ``PYTHONPATH=OTHER python benchmarks/...`` to
compare two versions of the library (one at a time: the ratios are what compare).
"""
from __future__ import annotations

import argparse
import copy

import torch

import bfp
import bfp.models
from bfp.models.gpt import GPT

from _harness import alternate, emit_json, machine, print_table, sgd_step


def models() -> dict[str, tuple[torch.nn.Module, torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    vit = bfp.models.create("ViT", num_classes=10, dim=64, depth=4, heads=2)
    gpt = GPT(100, block=64)
    return {"ViT": (vit, torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,))),
            "GPT": (gpt, torch.randint(0, 100, (128, 64)), torch.randint(0, 100, (128, 64)))}


def _flat(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its outputs as (rows, classes), as cross-entropy takes them (GPT: per token)."""
    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            out = self.inner(x)
            return out.reshape(-1, out.shape[-1])
    return Flat()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["any_fp8_h100", "any_fp8_h100_promoted"])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (each times every variant once)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()
    if args.rounds < 1 or args.threads < 1:
        raise SystemExit(f"--rounds and --threads must be positive, got {args.rounds} and {args.threads}")
    torch.set_num_threads(args.threads)
    rows = []
    for name, (base, x, y) in models().items():
        fns = {"fp32": sgd_step(_flat(base), x, y.reshape(-1))}
        for cfg in args.configs:
            fns[cfg] = sgd_step(_flat(bfp.convert(copy.deepcopy(base), cfg)), x, y.reshape(-1))
        t = alternate(fns, args.rounds, warmup=1)
        rows += [{"model": name, "variant": k, "step_ms": 1e3 * t.median(k), "ratio_to_fp32": t.median(k) / t.median("fp32")}
                 for k in fns]
    print(f"training steps, {torch.get_num_threads()} torch threads, median of {args.rounds} rounds")
    print_table([("model", "s"), ("variant", "s"), ("step ms", ".1f"), ("x fp32", ".2f")],
                [(r["model"], r["variant"], r["step_ms"], r["ratio_to_fp32"]) for r in rows])
    emit_json({"meta": machine(rounds=args.rounds, threads=torch.get_num_threads()), "results": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
