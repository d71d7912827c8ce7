"""FP32 against mixed precision: step time, images/s, peak memory and accuracy after a fixed budget.

    python benchmarks/mixed_precision.py                                   # CPU: ResNet10 w16, digits
    python benchmarks/mixed_precision.py --device cuda --model ResNet50 --width 64 --batch 256 \\
        --dataset CIFAR10 --steps 100 --channels-last --compile --json mp.json

Variants (seed 004's table, plus one with simulated formats): ``fp32``;
``fp16`` (autocast, dynamic loss scaling); ``bf16`` (autocast, no scaling);
``fp16+<config>`` (fp16 autocast and the network config ``--bfp``, default
``any_FB16``). Each variant has its own copy of the same initial model and
optimizer (SGD, momentum 0.9, the same learning rate) and trains on the same
batches in the same order: ``--warmup`` untimed rounds, then ``--steps`` timed
rounds, each round one training step of every variant (order reversed every
other round, ``_harness.alternate``), so the ratios to fp32 come from steps
taken side by side. Then each variant is evaluated on the test set under its
own autocast: the accuracy after ``warmup + steps`` steps.

Figures: median step time (ms), images/s (batch / median), peak memory of a
step (CUDA only: ``max_memory_allocated`` during the step minus what was
allocated before it, plus the variant's own weights, gradients and momentum;
``n/a`` on the CPU, where torch has no per-step allocator statistics),
accuracy, and each variant's time and memory over fp32's.

``--channels-last`` converts models and inputs to NHWC. ``--compile`` wraps
each model in ``torch.compile``; a variant whose compiled model fails its
first step falls back to eager with a warning, never a crash: the Q-layers'
autograd Function calls Numba kernels, and TorchDynamo (PyTorch 2.14) fails
inside Numba's dispatcher (an AssertionError at the first call, before anything
is computed), so the fp16+config variant always runs eagerly. The JSON record
says which variants ran compiled.

Both flags apply on CUDA only (not yet run there: no GPU was lent to issue
12). On the project's CPU VM with PyTorch 2.14.1 they failed in ways no
fallback can catch, so there they warn and are ignored: the inductor-compiled
backward of the plain fp32 ResNet10 segfaulted (fp16 compiled and trained);
with ``--channels-last`` the eager fp32 backward of the same plain model
segfaulted (fp16 and bf16 trained), and the fp32+``any_FB16`` Q-layer model
did not finish two steps in 300 s.

Seed 004's figures (ResNet-50, CIFAR-10): 2x faster and half the memory with
mixed precision on a Titan RTX; the target on a GPU is >= 1.8x and <= 0.6x.
On a CPU, float16/bfloat16 autocast is mostly *slower* than float32 (no
tensor cores; casts cost): the CPU table shows what the code paths cost, not
what mixed precision buys.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import warnings

import torch
import torch.nn as nn

import bfp
import bfp.models
from bfp.amp import MixedPrecision
from bfp.data import cifar as D
from bfp.engine.step import PlainStep
from bfp.engine.trainer import topk_correct

from _harness import alternate, emit_json, machine, print_table


def _variants(config: str):
    return [("fp32", "fp32", None), ("fp16", "fp16", None), ("bf16", "bf16", None),
            (f"fp16+{config}", "fp16", config)]


def _state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                  if isinstance(t, torch.Tensor))
    return 2 * params + moments   # weights + their gradients + momentum


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ResNet10")
    ap.add_argument("--width", type=int, default=16, help="model width option (ResNet: layer1 channels)")
    ap.add_argument("--dataset", default="digits", help="digits (offline), CIFAR10, CIFAR100")
    ap.add_argument("--dataset-path", default=None)
    ap.add_argument("--bfp", default="any_FB16", help="network config of the fp16+config variant")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10, help="timed rounds (one step of every variant each)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (also trained)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch and Numba CPU threads (0: defaults)")
    ap.add_argument("--channels-last", action="store_true", help="NHWC models and inputs")
    ap.add_argument("--compile", action="store_true", help="torch.compile each model (eager fallback)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible to torch")
    if args.threads:
        import numba  # here, not at the top: see _harness.machine

        # Numba's OpenMP pool resets torch's thread count on its first parallel kernel unless set too.
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    for flag in ("compile", "channels_last"):
        if getattr(args, flag) and not cuda:
            # Crashes and stalls on the CPU that no fallback can catch: see the module docstring.
            warnings.warn(f"--{flag.replace('_', '-')}: CUDA only (on the CPU it crashed or stalled with "
                          f"PyTorch 2.14.1, see the docstring); ignored")
            setattr(args, flag, False)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format

    data = D.load(args.dataset, args.dataset_path, batch_size_train=args.batch, batch_size_test=256,
                  num_workers=0, device=dev, seed=args.seed)
    rounds = args.warmup + args.steps
    batches = [(x.to(dev).contiguous(memory_format=fmt), y.to(dev))
               for x, y in itertools.islice(itertools.cycle(data.train), rounds)]
    torch.manual_seed(args.seed)
    opts = {"width": args.width} if args.width else {}
    base = bfp.models.create(args.model, data.num_classes, data.in_channels, **opts)

    runs, compiled = {}, {}
    for name, dtype, config in _variants(args.bfp):
        model = bfp.convert(copy.deepcopy(base), config) if config else copy.deepcopy(base)
        model = model.to(dev, memory_format=fmt).train()
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        runs[name] = {"model": model, "run": model, "opt": opt, "amp": MixedPrecision(dtype, dev.type),
                      "batches": iter(batches), "peak": []}
        compiled[name] = False
        if args.compile:
            runs[name]["run"] = torch.compile(model)
            compiled[name] = True
    criterion, step = nn.CrossEntropyLoss(), PlainStep()

    def train_step(name):
        r = runs[name]
        x, y = next(r["batches"])
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev)
        try:
            step(r["run"], x, y, criterion=criterion, optimizer=r["opt"], amp=r["amp"])
        except Exception as e:  # noqa: BLE001 - torch.compile raises many types; fall back, never crash
            if r["run"] is r["model"]:
                raise
            warnings.warn(f"{name}: torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                          f"running eager")
            r["run"], compiled[name] = r["model"], False
            step(r["model"], x, y, criterion=criterion, optimizer=r["opt"], amp=r["amp"])
        if cuda:
            sync()
            r["peak"].append(torch.cuda.max_memory_allocated(dev) - before)

    names = list(runs)
    timings = alternate({n: (lambda n=n: train_step(n)) for n in names}, args.steps, warmup=args.warmup,
                        sync=sync)

    rows, results = [], {}
    t32 = timings.median("fp32")
    mem32 = None
    for n in names:
        r = runs[n]
        acc = _accuracy(r["model"], r["amp"], data.test, dev, fmt)
        med = timings.median(n)
        mem = (max(r["peak"]) + _state_bytes(r["model"], r["opt"])) / 2 ** 20 if cuda else None
        mem32 = mem if n == "fp32" else mem32
        results[n] = {"step_ms_median": 1e3 * med, "step_ms_fastest": 1e3 * timings.fastest(n),
                      "images_per_s": args.batch / med, "peak_mem_mb": mem, "test_acc1": acc,
                      "time_vs_fp32": med / t32, "speedup_vs_fp32": t32 / med,
                      "mem_vs_fp32": (mem / mem32) if cuda else None,
                      "pair_ratio_median": statistics.median(timings.pair_ratios(n, "fp32")),
                      "skipped_steps": r["amp"].scaler.skipped_steps, "loss_scale": r["amp"].scaler.scale,
                      "compiled": compiled[n]}
        rows.append((n, 1e3 * med, args.batch / med, "n/a" if mem is None else f"{mem:.0f}", acc,
                     t32 / med, "n/a" if mem is None else f"{mem / mem32:.2f}", r["amp"].scaler.skipped_steps))
    print(f"{args.model} (width {args.width}) on {args.dataset}, batch {args.batch}, device {dev}, "
          f"{args.warmup}+{args.steps} steps{', channels_last' if args.channels_last else ''}"
          f"{', compiled' if args.compile else ''}")
    print_table([("variant", "s"), ("step ms", ".1f"), ("img/s", ".0f"), ("peak MB", ">s"), ("acc %", ".2f"),
                 ("speedup", ".2f"), ("mem ratio", ">s"), ("skipped", "d")], rows)
    emit_json(machine(benchmark="mixed_precision", model=args.model, width=args.width, dataset=args.dataset,
                      batch=args.batch, steps=args.steps, warmup=args.warmup, device=str(dev),
                      channels_last=args.channels_last, compile=args.compile, bfp=args.bfp,
                      results=results), args.json)
    return 0


@torch.no_grad()
def _accuracy(model, amp, loader, dev, fmt) -> float:
    model.eval()
    hit = n = 0
    for x, y in loader:
        x, y = x.to(dev).contiguous(memory_format=fmt), y.to(dev)
        with amp.autocast():
            out = model(x).float()
        hit += int(topk_correct(out, y, ks=(1,))[0])
        n += len(y)
    model.train()
    return 100.0 * hit / max(1, n)


if __name__ == "__main__":
    raise SystemExit(main())
