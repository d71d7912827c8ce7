"""End-to-end training-step overhead of simulated low precision against FP32.

    python benchmarks/overhead.py                                  # CPU, ResNet18, batch 32
    python benchmarks/overhead.py --device cuda --batch 128        # on a GPU
    python benchmarks/overhead.py --configs ResNet18_FB16 any_fp8_e4m3 --steps 20 --json out.json

One training step (forward, backward, SGD update) of a CIFAR-size model on
random 32x32 inputs, FP32 and each network config in turn, timed in rounds that
visit every variant once (so machine noise hits all alike); each variant keeps
its own copy of the model. The ratio is of median step times. Targets
(REFERENCE.md): BFP training <= 1.3x FP32 on a CPU, <= 1.2x on a GPU; QPyTorch
measured 2.02x (8-bit BFP) and 2.34x (e4m3) on the CPU.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bfp  # noqa: E402
import bfp.models  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ResNet18")
    ap.add_argument("--width", type=int, default=None, help="model width option (ResNet: layer1 channels)")
    ap.add_argument("--configs", nargs="+", default=["ResNet18_FB16", "ResNet18_FB12LG16", "any_fp8_e4m3"],
                    help="network configs (conf_net presets or paths)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="timed rounds (each times every variant once)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible to torch")
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    opts = {} if args.width is None else {"width": args.width}
    base = bfp.models.create(args.model, num_classes=10, **opts).to(dev)
    variants = {"fp32": base}
    for cfg in args.configs:
        variants[cfg] = bfp.convert(copy.deepcopy(base), cfg)
    opt = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in variants.items()}
    x = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)

    def step(name: str) -> float:
        m, o = variants[name], opt[name]
        sync()
        t = time.perf_counter()
        o.zero_grad(set_to_none=True)
        F.cross_entropy(m(x), y).backward()
        o.step()
        sync()
        return time.perf_counter() - t

    for name in variants:  # warm-up: kernel compilation, allocator
        step(name), step(name)
    times = {name: [] for name in variants}
    for r in range(args.steps):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            times[name].append(step(name))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [{"variant": k, "step_ms": 1e3 * med[k], "ratio_to_fp32": med[k] / med["fp32"]} for k in variants]
    print(f"{args.model} batch {args.batch} on {dev}, {torch.get_num_threads()} torch threads, "
          f"median of {args.steps} rounds")
    print(f"{'variant':24s} {'step ms':>9s} {'x fp32':>7s}")
    for r in rows:
        print(f"{r['variant']:24s} {r['step_ms']:9.1f} {r['ratio_to_fp32']:7.2f}")
    out = {"meta": {"model": args.model, "batch": args.batch, "device": str(dev), "steps": args.steps,
                    "torch": torch.__version__, "threads": torch.get_num_threads()}, "results": rows}
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
