"""Cost of dynamic precision control (``--do``): training-step time with and
without ``bfp.dynamic.DynamicPrecision`` measuring ZSE, as ratios taken in the
same run.

The model is a CIFAR ResNet (``bfp.models``) on scikit-learn digits: by
default the raw 8x8 images, one channel (``--size 32`` pads/upsamples them to
the engine's 32x32). Every converted layer quantizes fw/fi/bwo/bwi/bio/biw to
BlockFloat(8, [1,12,3,3]) (conv1 and the classifier stay float, as in the
original presets). The controller's spec ``Simple/0/1/0/0/EVERY/sample=N``
never changes precision, so both variants do the same arithmetic, but it
measures one step in N and decides (host sync, log rows) every EVERY steps,
driven through the callback methods the engine calls.

Two measurements:

* whole steps, one with and one without the controller in turn (the order
  flips every pair) so drift in the machine's speed hits both alike: median
  ratio over adjacent pairs, of wall and of process CPU time, and the ratio
  of the fastest steps;
* the quantization calls of one step replayed alone, best of ``--reps``,
  without the hook, with it measuring and with it not measuring: the
  difference, weighted by the sampling, plus a decision's cost spread over
  EVERY steps, is what ``--do`` adds to a step; reported as a share of the
  fastest step without it. This one survives a busy machine best.

On a shared CPU run it single-threaded for stable numbers:

    NUMBA_NUM_THREADS=1 python benchmarks/dynamic_overhead.py --threads 1
    python benchmarks/dynamic_overhead.py --json out.json --size 32 --model ResNet18 --width 16
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import bfp
import bfp.models
from bfp.dynamic import DEFAULT_SAMPLE, DynamicPrecision
from bfp.kernels import quantize_stats

from _harness import alternate, emit_json, machine, print_table

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


def replay_cost(model, dp, step, reps: int) -> dict[str, float]:
    """Seconds per step spent quantizing, without and with the controller's hook.

    One step's quantization calls are recorded, then replayed alone ``reps``
    times each way, alternating; the minimum of each is taken (the run least
    disturbed by other processes). Their difference is what ``--do`` adds to
    a step's quantization, independent of the GEMMs' noise.
    """
    calls = []
    layers = list(dp.layers.values())

    def record(layer, point, tensor, fmt):
        calls.append((layer, point, tensor.detach().clone(), fmt))
        return quantize_stats(tensor, fmt, stats=False)[0]

    for m in layers:
        m.quantize_hook = record
    step()
    for m in layers:
        m.quantize_hook = None
    dp.install()
    hooks = [layer.quantize_hook for layer, *_ in calls]
    dp.remove()

    def without():
        for _, _, tensor, fmt in calls:
            quantize_stats(tensor, fmt, stats=False)

    def hooked():
        for hook, call in zip(hooks, calls):
            hook(*call)

    timings = alternate({"without": without, "measured": hooked, "unmeasured": hooked}, reps, warmup=0,
                        setup=lambda variant: setattr(dp, "_measuring", variant == "measured"))
    best = {variant: timings.fastest(variant) for variant in timings.wall}
    t0 = time.perf_counter()
    dp.decide()
    best["decision"] = time.perf_counter() - t0
    best["calls"] = len(calls)
    return best


def median_q1_q3(ratios: list[float]) -> tuple[float, float, float]:
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), q1, q3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ResNet10", help="bfp.models name (default ResNet10)")
    ap.add_argument("--width", type=int, default=32, help="channels of layer1 (default 32)")
    ap.add_argument("--size", type=int, default=8, help="image side: 8 = raw digits (default)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=60, help="timed steps per variant (default 60)")
    ap.add_argument("--reps", type=int, default=30, help="replays of one step's quantizations")
    ap.add_argument("--every", type=int, default=10, help="decision interval in steps")
    ap.add_argument("--sample", type=int, default=DEFAULT_SAMPLE,
                    help=f"measure one step in N (the spec's sample=, default {DEFAULT_SAMPLE})")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    x_all, y_all = digits(args.size)
    model = build(args.model, args.width, 8, [1, 12, 3, 3])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dp = DynamicPrecision(model, f"Simple/0/1/0/0/{args.every}/sample={args.sample}")  # never changes bits
    trainer = SimpleNamespace(model=model, writer=None, run_dir=None, global_step=0, epoch=0,
                              log=lambda msg: None)
    dp.on_train_start(trainer)
    dp.remove()
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

    def step_with_do():
        step()  # then sampling, and a decision (host sync, log rows) every --every of these steps
        trainer.global_step += 1
        dp.on_batch_end(trainer, trainer.global_step)

    def hooks_as_left(variant: str) -> None:
        """Hooked as the callback leaves them (only before measured steps); none without --do."""
        dp.sync_hooks() if variant == "with" else dp.remove()

    # Single steps alternate, the order flipping every pair, so load drift hits both alike;
    # two warm-up pairs: Numba compiles, the allocator settles.
    t = alternate({"without": step, "with": step_with_do}, args.pairs, warmup=2, setup=hooks_as_left)
    dp.remove()
    replay = replay_cost(model, dp, step, args.reps)

    med = {k: (1e3 * t.median(k), 1e3 * statistics.median(t.cpu[k]), 1e3 * t.fastest(k))
           for k in ("without", "with")}
    added_ms = 1e3 * ((replay["measured"] - replay["without"]) / args.sample
                      + (replay["unmeasured"] - replay["without"]) * (1 - 1 / args.sample)
                      + replay["decision"] / args.every)
    result = machine(
        benchmark="dynamic_overhead", model=args.model, width=args.width,
        input=[1, args.size, args.size], batch=args.batch, pairs=args.pairs,
        decide_every=args.every, sample=args.sample, threads=torch.get_num_threads(), layers=len(dp.layers),
        quantize_calls_per_step=replay["calls"],
        step_ms_without=med["without"][0], step_ms_with=med["with"][0],
        cpu_ms_without=med["without"][1], cpu_ms_with=med["with"][1],
        fastest_step_ms_without=med["without"][2], fastest_step_ms_with=med["with"][2],
        wall_ratio_median_q1_q3=median_q1_q3(t.pair_ratios("with", "without")),
        cpu_ratio_median_q1_q3=median_q1_q3(t.pair_ratios("with", "without", cpu=True)),
        fastest_ratio=med["with"][2] / med["without"][2],
        replay_quantize_ms_without=1e3 * replay["without"],
        replay_quantize_ms_measured=1e3 * replay["measured"],
        replay_quantize_ms_unmeasured=1e3 * replay["unmeasured"],
        decision_ms=1e3 * replay["decision"], added_ms_per_step=added_ms,
        added_fraction_of_fastest_step=added_ms / med["without"][2],
    )
    print_table([("variant", "s"), ("median wall ms", ".2f"), ("median CPU ms", ".2f"), ("fastest ms", ".2f")],
                [(label, *med[k]) for label, k in (("without --do", "without"), ("with --do", "with"))])
    w, c = result["wall_ratio_median_q1_q3"], result["cpu_ratio_median_q1_q3"]
    print(f"with/without over {args.pairs} adjacent pairs: wall {w[0]:.3f} (quartiles {w[1]:.3f}..{w[2]:.3f}), "
          f"CPU {c[0]:.3f} ({c[1]:.3f}..{c[2]:.3f}); fastest steps {result['fastest_ratio']:.3f}")
    print(f"replayed quantization of one step ({replay['calls']} calls, best of {args.reps}): "
          f"{result['replay_quantize_ms_without']:.2f} ms without the hook, "
          f"{result['replay_quantize_ms_measured']:.2f} ms measured, "
          f"{result['replay_quantize_ms_unmeasured']:.2f} ms on unmeasured steps; a decision "
          f"{result['decision_ms']:.2f} ms every {args.every} steps; one step in {args.sample} measured")
    print(f"added by --do: {added_ms:.3f} ms/step = {100 * result['added_fraction_of_fastest_step']:.2f}% of the "
          f"fastest step (load average {result['load_average_1min']:.1f} on {result['cpus']} CPUs)")
    emit_json(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
