"""Cost of dynamic precision control (``--do``): training-step time with and
without ``bfp.dynamic.DynamicPrecision`` measuring ZSE, as ratios taken in the
same run.

The model is a CIFAR ResNet (``bfp.models``) on scikit-learn digits: by
default the raw 8x8 images, one channel (``--size 32`` pads/upsamples them to
the engine's 32x32). Every converted layer quantizes fw/fi/bwo/bwi/bio/biw to
BlockFloat(8, [1,12,3,3]) (conv1 and the classifier stay float, as in the
original presets). Both variants train the same model, one step each in
turn (the order flips every pair), so drift in the machine's speed hits both
alike; the ratio reported is the median over pairs of adjacent steps. The controller's spec ``Simple/0/1/0/0``
never changes precision, so both variants do the same arithmetic, but it
still makes a decision (host sync, log rows) every ``--every`` steps.

    python benchmarks/dynamic_overhead.py                 # table + JSON on stdout
    python benchmarks/dynamic_overhead.py --json out.json --size 32 --model ResNet18
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bfp  # noqa: E402
import bfp.models  # noqa: E402
from bfp.dynamic import DynamicPrecision  # noqa: E402

POINTS_ON = ("fw", "fi", "bwo", "bwi", "bio", "biw")


def digits(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    if size != 8:
        x = F.interpolate(x, size=size, mode="nearest")
    return (x - x.mean()) / x.std(), torch.tensor(d.target)


def build(model_name: str, width: int, bits: int, group: list[int]) -> torch.nn.Module:
    """The model converted with an original-form config: six points at ``bits``."""
    model = bfp.models.create(model_name, num_classes=10, in_channels=1, width=width)
    config = {"default": {**{f"{p}_bit": bits for p in POINTS_ON}, **{f"{p}_dim": group for p in POINTS_ON}},
              "net.conv1": {"type": "default"}, "net.linear": {"type": "default"}}
    return bfp.convert(model, config)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ResNet10", help="bfp.models name (default ResNet10)")
    ap.add_argument("--width", type=int, default=32, help="channels of layer1 (default 32)")
    ap.add_argument("--size", type=int, default=8, help="image side: 8 = raw digits (default)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=60, help="timed steps per variant (default 60)")
    ap.add_argument("--every", type=int, default=10, help="decision interval in steps")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    x_all, y_all = digits(args.size)
    model = build(args.model, args.width, 8, [1, 12, 3, 3])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dp = DynamicPrecision(model, f"Simple/0/1/0/0/{args.every}")
    model.train()
    batches = [(x_all[i:i + args.batch], y_all[i:i + args.batch])
               for i in range(0, len(y_all) - args.batch + 1, args.batch)]
    counter = {"i": 0}

    def step():
        xb, yb = batches[counter["i"] % len(batches)]
        counter["i"] += 1
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(xb), yb).backward()
        opt.step()

    decided = {"n": 0}

    def timed_step(with_do: bool) -> float:
        if with_do:
            dp.install()
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        if with_do:
            decided["n"] += 1
            if decided["n"] % args.every == 0:
                dp.decide(step=counter["i"])  # host sync + log rows, amortised over --every steps
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        dp.remove()
        return dt, dc

    for _ in range(2):  # warm-up: Numba compiles, the allocator settles
        timed_step(False), timed_step(True)
    wall, cpu = {False: [], True: []}, {False: [], True: []}
    for r in range(args.pairs):  # alternate single steps, flipping the order, so load drift hits both
        for with_do in ((False, True) if r % 2 == 0 else (True, False)):
            dt, dc = timed_step(with_do)
            wall[with_do].append(dt)
            cpu[with_do].append(dc)
    ratios = [on / off for on, off in zip(wall[True], wall[False])]
    cpu_ratios = [on / off for on, off in zip(cpu[True], cpu[False])]
    q = statistics.quantiles
    result = {
        "benchmark": "dynamic_overhead", "model": args.model, "width": args.width,
        "input": [1, args.size, args.size], "batch": args.batch, "pairs": args.pairs,
        "decide_every": args.every, "threads": torch.get_num_threads(), "layers": len(dp.layers),
        "torch": torch.__version__, "machine": platform.machine(), "cpus": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "step_ms_without": 1e3 * statistics.median(wall[False]),
        "step_ms_with": 1e3 * statistics.median(wall[True]),
        "ratio_median": statistics.median(ratios), "ratio_q1": q(ratios, n=4)[0], "ratio_q3": q(ratios, n=4)[2],
        "ratio_of_medians": statistics.median(wall[True]) / statistics.median(wall[False]),
        "cpu_ms_without": 1e3 * statistics.median(cpu[False]),
        "cpu_ms_with": 1e3 * statistics.median(cpu[True]),
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "cpu_ratio_q1": q(cpu_ratios, n=4)[0], "cpu_ratio_q3": q(cpu_ratios, n=4)[2],
    }
    print(f"{'variant':<16}{'wall ms/step':>14}{'CPU ms/step':>14}")
    for label, key in (("without --do", "without"), ("with --do", "with")):
        print(f"{label:<16}{result[f'step_ms_{key}']:>14.2f}{result[f'cpu_ms_{key}']:>14.2f}")
    print(f"with/without, median over adjacent pairs: wall {result['ratio_median']:.3f} "
          f"(quartiles {result['ratio_q1']:.3f}..{result['ratio_q3']:.3f}), CPU "
          f"{result['cpu_ratio_median']:.3f} (quartiles {result['cpu_ratio_q1']:.3f}.."
          f"{result['cpu_ratio_q3']:.3f}); load average {result['load_average_1min']:.1f} on "
          f"{result['cpus']} CPUs")
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
