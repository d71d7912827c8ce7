"""End-to-end training-step overhead of simulated low precision against FP32.

    python benchmarks/overhead.py                                  # CPU, ResNet18, batch 32
    python benchmarks/overhead.py --device cuda --batch 128        # on a GPU
    python benchmarks/overhead.py --configs ResNet18_FB16 any_fp8_e4m3 --steps 20 --json out.json
    python benchmarks/overhead.py --configs ResNet18_FB12 --diagnose 10   # the cost of --diagnose 10
    python benchmarks/overhead.py --device cuda --batch 128 --modes eager,compile,graph --bf16

``--modes``: ``eager`` (the plain step), ``compile`` (the model under ``torch.compile``, fullgraph, as
``--compile default``), ``graph`` (the whole step captured as one CUDA graph and replayed, as
``--cuda-graph``; GPU only). Each mode's ratio is to FP32 in the same mode; with several modes the
table has a column pair per mode (the JSON one row per variant and mode). ``--bf16`` adds FP32
weights under bf16 autocast, the mixed-precision reference point.

One training step (forward, backward, SGD update) of a CIFAR-size model on
random 32x32 inputs, FP32 and each network config in turn, timed in rounds that
visit every variant once (so machine noise hits all alike); each variant keeps
its own copy of the model. The ratio is of median step times; "paired" is the median
of each round's own ratio, "CPU time" the ratio of median process CPU times (both
steadier when other processes share the cores). Targets
(REFERENCE.md): BFP training <= 1.3x FP32 on a CPU, <= 1.2x on a GPU; QPyTorch
measured 2.02x (8-bit BFP) and 2.34x (e4m3) on the CPU.
"""
from __future__ import annotations

import argparse
import copy
import statistics

import torch

import bfp
import bfp.models
from bfp.diagnostics import PointDiagnostics

from _harness import alternate, check_args, emit_json, machine, print_table, sgd_step


def diagnosed(model, step):
    """``step`` with every quantization point of ``model`` measured (bfp.diagnostics)."""
    diag = PointDiagnostics(model)

    def run() -> None:
        diag.arm()
        try:
            step()
        finally:
            diag.disarm()
    return run


MODES = ("eager", "compile", "graph")


def make_step(model, x, y, mode: str, bf16: bool):
    """One timed training step of ``model`` in ``mode`` (``graph``: warmed up and captured here, untimed)."""
    from bfp.amp import MixedPrecision
    if mode == "eager" and not bf16:
        return sgd_step(model, x, y)
    amp = MixedPrecision("bf16" if bf16 else "fp32", x.device.type)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    crit = torch.nn.CrossEntropyLoss()
    if mode == "graph":
        from bfp.engine.graphed import GraphedStep
        step = GraphedStep()
        run = lambda: step(model, x, y, criterion=crit, optimizer=opt, amp=amp)  # noqa: E731
        for _ in range(step.warmup + 1):  # eager warm-up steps and the capture
            run()
        return run
    net = torch.compile(model, fullgraph=True) if mode == "compile" else model
    return lambda: amp.train_step(net, x, y, criterion=crit, optimizer=opt)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ResNet18")
    ap.add_argument("--width", type=int, default=None, help="model width option (ResNet: layer1 channels)")
    ap.add_argument("--configs", nargs="+", default=["ResNet18_FB16", "ResNet18_FB12LG16", "any_fp8_e4m3"],
                    help="network configs (conf_net presets or paths)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="timed rounds (each times every variant once)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--diagnose", type=int, default=0, metavar="N",
                    help="also time each config with bfp.diagnostics measuring the step (--diagnose N): the "
                         "measured step itself, and its cost spread over N steps")
    ap.add_argument("--modes", default="eager", help=f"comma-separated: {', '.join(MODES)} (module docstring)")
    ap.add_argument("--bf16", action="store_true", help="add FP32 weights under bf16 autocast")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    check_args(ap, at_least={"--steps": (args.steps, 1), "--batch": (args.batch, 1), "--width": (args.width, 1),
                             "--diagnose": (args.diagnose, 0)}, json_path=args.json)
    if args.model not in bfp.models.names():
        ap.error(f"--model {args.model!r} unknown; allowed: {', '.join(bfp.models.names())}")
    for cfg in args.configs:
        try:
            bfp.load_config(cfg)
        except (bfp.ConfigError, ValueError, OSError) as e:
            ap.error(f"--configs {cfg}: {e}")
    try:
        dev = torch.device(args.device)
    except RuntimeError:
        ap.error(f"--device {args.device!r} is not a device; allowed: cpu, cuda, cuda:N")
    if dev.type not in ("cpu", "cuda"):
        ap.error(f"--device {args.device!r}: allowed cpu, cuda, cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU is visible to torch")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    opts = {} if args.width is None else {"width": args.width}
    base = bfp.models.create(args.model, num_classes=10, **opts).to(dev)
    variants = {"fp32": base}
    for cfg in args.configs:
        variants[cfg] = bfp.convert(copy.deepcopy(base), cfg)
    x = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)

    if args.bf16:
        variants["bf16 autocast"] = copy.deepcopy(base)
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES] + (["graph"] if "graph" in modes and dev.type != "cuda" else [])
    if bad:
        ap.error(f"--modes {args.modes}: {', '.join(bad)} not possible here; allowed: {', '.join(MODES)} "
                 f"(graph needs --device cuda)")
    if args.diagnose and "eager" not in modes:
        ap.error("--diagnose times measured steps, which run eagerly: include eager in --modes")
    fns = {}
    for mode in modes:
        for name, m in variants.items():
            key = name if mode == "eager" else f"{name} [{mode}]"
            fns[key] = make_step(copy.deepcopy(m) if len(modes) > 1 else m, x, y, mode, name == "bf16 autocast")
    for cfg in args.configs if args.diagnose else ():  # the measured step of each config, on its own copy
        m = copy.deepcopy(variants[cfg])
        fns[f"{cfg} measured"] = diagnosed(m, make_step(m, x, y, "eager", False))
    # Two warm-up rounds: kernel compilation, the allocator.
    t = alternate(fns, args.steps, warmup=2, sync=sync)
    def fp32_of(k: str) -> str:
        return "fp32" + k[k.index(" ["):] if k.endswith("]") and " [" in k else "fp32"
    rows = [{"variant": k, "step_ms": 1e3 * t.median(k), "ratio_to_fp32": t.median(k) / t.median(fp32_of(k)),
             # steadier on a shared machine: each round's own ratio, and process CPU time (time
             # another process takes from this one's threads is not counted)
             "paired_ratio": statistics.median(t.pair_ratios(k, fp32_of(k))),
             "cpu_ratio": statistics.median(t.cpu[k]) / statistics.median(t.cpu[fp32_of(k)])}
            for k in fns]
    for cfg in args.configs if args.diagnose else ():
        per_step = t.median(f"{cfg} measured") / t.median(cfg)
        rows.append({"variant": f"{cfg} --diagnose {args.diagnose}",
                     "step_ms": 1e3 * t.median(cfg) * (1 + (per_step - 1) / args.diagnose),
                     "ratio_to_fp32": t.median(cfg) * (1 + (per_step - 1) / args.diagnose) / t.median("fp32"),
                     "ratio_to_config": 1 + (per_step - 1) / args.diagnose, "measured_step_ratio": per_step})
    print(f"{args.model} batch {args.batch} on {dev}, {torch.get_num_threads()} torch threads, "
          f"median of {args.steps} rounds")
    if len(modes) == 1 or args.diagnose:  # --diagnose adds rows of its own: one row a variant and mode
        print_table([("variant", "s"), ("step ms", ".1f"), ("x fp32", ".2f"), ("paired", ".2f"), ("CPU time", ".2f")],
                    [(r["variant"], r["step_ms"], r["ratio_to_fp32"], r.get("paired_ratio", float("nan")),
                      r.get("cpu_ratio", float("nan"))) for r in rows])
    else:  # one column pair a mode: its step time and its ratio to FP32 in the same mode
        by = {r["variant"]: r for r in rows}
        cols = [("variant", "s")] + [c for m in modes for c in ((f"{m} ms", ".1f"), (f"{m} x fp32", ".2f"))]
        print_table(cols, [(name, *[v for m in modes for v in (
            by[name if m == "eager" else f"{name} [{m}]"]["step_ms"],
            by[name if m == "eager" else f"{name} [{m}]"]["ratio_to_fp32"])]) for name in variants])
    meta = machine(model=args.model, batch=args.batch, device=str(dev), steps=args.steps,
                   threads=torch.get_num_threads())
    emit_json({"meta": meta, "results": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
