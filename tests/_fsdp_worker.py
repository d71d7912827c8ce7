"""One rank of the FSDP2 tests (tests/test_fsdp.py), RANK/WORLD_SIZE/MASTER_* set by the test.

    python tests/_fsdp_worker.py PRESET OUT.pt
    python tests/_fsdp_worker.py --reference PRESET OUT.pt WORLD   (one process, as the ranks' threads)

A small GPT (attention included) converted to PRESET, then ``fully_shard`` on every block and the
root (FSDP2 on gloo, CPU), trained ``STEPS`` SGD steps on this rank's slice of each global batch; rank
0 saves the full parameters after training. ``reference(preset, world)`` is what it must equal: the
same model in one process, each worker's gradient computed on its slice, averaged, the same SGD."""
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS, BATCH, T, VOCAB = int(os.environ.get("FSDP_STEPS", 3)), 12, 8, 32


def model(preset: str) -> nn.Module:
    import bfp
    from bfp.models.gpt import GPT
    torch.manual_seed(0)
    m = GPT(vocab=VOCAB, block=T, dim=32, depth=2, heads=2)
    if preset == "fp32":
        return m
    return bfp.convert(m, preset, example_input=torch.zeros(2, T, dtype=torch.long))


def batches():
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randint(0, VOCAB, (BATCH, T), generator=g)
        yield x, torch.randint(0, VOCAB, (BATCH * T,), generator=g)


def loss_of(m, x, y):
    return nn.functional.cross_entropy(m(x), y)


def data_parallel(m: nn.Module, world: int, combine, weights=None, start=None) -> dict[str, torch.Tensor]:
    """One process standing for ``world`` workers: each worker's gradient on its slice, ``combine(grads)``
    the gradient the master gets; ``weights(master)``: the values the forward computes with (the master
    itself by default; ``start``: the master's first values, ``m``'s by default). SGD on the master;
    returns it."""
    master = [p.detach().clone().requires_grad_(True) for p in (start or m.parameters())]
    opt = torch.optim.SGD(master, lr=0.5)
    for x, y in batches():
        with torch.no_grad():
            for p, w in zip(m.parameters(), master):
                p.copy_(w if weights is None else weights(w))
        grads = []
        for xs, ys in zip(x.chunk(world), y.chunk(world)):
            m.zero_grad(set_to_none=True)
            loss_of(m, xs, ys).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        for w, *gs in zip(master, *grads):
            w.grad = combine(gs)
        opt.step()
    return {k: w.detach().clone() for (k, _), w in zip(m.named_parameters(), master)}


def reference(preset: str, world: int) -> dict[str, torch.Tensor]:
    """Data parallel in one process, exactly: with two workers (g0 + g1) / 2 is the same float in any
    order and FSDP's division by 2 is exact, however it splits it."""
    return data_parallel(model(preset), world, lambda gs: (gs[0] + gs[1]) / 2)


def train_sharded(m: nn.Module, out: str, mp=None, install=lambda m: []) -> None:
    """This rank's FSDP2 training of ``m`` (``fully_shard`` per block and the root, ``install(m)`` the
    comms), rank 0 saving the full parameters and the comms' call count."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    try:
        for block in m.blocks:
            fully_shard(block, mp_policy=mp or MixedPrecisionPolicy())
        fully_shard(m, mp_policy=mp or MixedPrecisionPolicy())
        comms = install(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        for x, y in batches():
            opt.zero_grad(set_to_none=True)
            loss_of(m, x.chunk(world)[rank], y.chunk(world)[rank]).backward()
            opt.step()
        full = {k: v.full_tensor() for k, v in m.named_parameters()}
        if rank == 0:
            torch.save({"params": full, "calls": sum(c.calls for c in comms)}, out)
        dist.barrier()  # every rank done before any tears its connections down (as the scripts do)
    finally:
        dist.destroy_process_group()


def main(preset: str, out: str) -> None:
    train_sharded(model(preset), out)


def grad_reduce(order: str, fmt: str, average: bool):
    """``RoundedReduce`` of ``fmt``, ``+aps``/``+kahan``/``+sr`` (stochastic rounding, one reducer a
    shard) appended to switch those on (``e4m3+aps``)."""
    import dataclasses
    from bfp.distributed.reduce import RoundedReduce
    from bfp.formats import Float, format_from_name
    name, *extras = fmt.split("+")
    f = Float(5, 10, overflow="inf") if name == "ieee-fp16" else format_from_name(name)
    if "sr" in extras:
        f = dataclasses.replace(f, rounding="stochastic")
    return RoundedReduce(f, order=order, average=average, aps="aps" in extras, kahan="kahan" in extras,
                         one_reducer="sr" in extras)


def rounded_reduce_scatter(kind: str, order: str, fmt: str, out: str, preset: str = "fp32",
                           transport: str = "auto") -> None:
    """FSDP2 training of the FP32 GPT with ``kind``: ``real16`` (torch's own float16 reduce-scatter,
    ``MixedPrecisionPolicy(reduce_dtype=float16)``), ``replay16`` (the same policy, the rounded comm in
    replay mode summing in ``fmt`` and ``order``), ``simulate`` (the comm averaging in ``fmt``/``order``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from bfp.distributed.fsdp import install_rounded_reduce_scatter
    mp = MixedPrecisionPolicy(reduce_dtype=torch.float16) if kind in ("real16", "replay16") else None
    install = (lambda m: []) if kind == "real16" else lambda m: install_rounded_reduce_scatter(
        m, grad_reduce(order, fmt, kind == "simulate"), "replay" if kind == "replay16" else "simulate",
        transport=transport)
    train_sharded(model(preset), out, mp, install)


def rs_reference(order: str, fmt: str, world: int, preset: str = "fp32") -> dict[str, torch.Tensor]:
    """Every worker's gradient stacked and reduced by ``RoundedReduce`` parameter by parameter."""
    reduce = grad_reduce(order, fmt, True)
    return data_parallel(model(preset), world, lambda gs: reduce(torch.stack(gs)))


def rounded_all_gather(fmt: str, out: str, param_dtype: str = "float32") -> None:
    """FSDP2 training of the FP32 GPT whose weights are rounded to ``fmt`` as they are all-gathered;
    ``param_dtype`` bfloat16: FSDP casts the shards to bfloat16 first and the layers compute in it
    (gradients reduced in float32), TorchTitan's double rounding."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from bfp.distributed.fsdp import install_rounded_all_gather
    from bfp.formats import format_from_name
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if param_dtype == "bfloat16" else None
    train_sharded(model("fp32"), out, mp, install=lambda m: install_rounded_all_gather(m, format_from_name(fmt)))


def ag_reference(fmt: str, world: int, param_dtype: str = "float32", order: str = "ag") -> dict[str, torch.Tensor]:
    """The master rounded to ``fmt`` before every forward (``order`` "ag": cast to ``param_dtype``
    first, then rounded, as the comm sees it; "fmt-first": rounded, then cast), the two workers'
    gradients averaged in float32."""
    import bfp
    f, dtype = bfp.format_from_name(fmt), getattr(torch, param_dtype)
    weights = (lambda w: bfp.quantize(w.to(dtype), f)) if order == "ag" else lambda w: bfp.quantize(w, f).to(dtype)
    m = model("fp32")
    start = [p.detach().clone() for p in m.parameters()]  # the float32 master, before m computes in ``dtype``
    return data_parallel(m.to(dtype), world, lambda gs: (gs[0].float() + gs[1].float()) / 2, weights, start)


def tensor_parallel(presets: str, out: str) -> None:
    """A converted MLP with its middle GEMMs column- then row-parallel (``parallelize_module``) on this
    rank's mesh, for each of the comma-separated ``presets`` in turn in this one process (a sharding
    decision DTensor caches for one format must not be reused for the next); rank 0 saves each preset's
    output and gradients, and the unparallelized model's, for the test."""
    import copy
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    import bfp
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
        saved = {}
        for preset in presets.split(","):
            torch.manual_seed(0)
            m = bfp.convert(nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32),
                                          nn.Linear(32, 4)), preset, example_input=torch.randn(2, 8))
            ref = copy.deepcopy(m)
            parallelize_module(m, mesh, {"1": ColwiseParallel(), "3": RowwiseParallel()})
            x = torch.randn(6, 8, generator=torch.Generator().manual_seed(2))
            torch.manual_seed(1)  # the same stochastic-rounding draws for both models
            got = m(x)
            got.square().sum().backward()
            torch.manual_seed(1)
            want = ref(x)
            want.square().sum().backward()
            grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
                     for n, p in m.named_parameters()}
            saved[preset] = {"got": got.detach(), "want": want.detach(), "grads": grads,
                             "ref_grads": {n: p.grad for n, p in ref.named_parameters()}}
        from torch.distributed.tensor import Shard, distribute_tensor
        from bfp.formats import format_from_name
        w = torch.randn(64, 32, generator=torch.Generator().manual_seed(3)) * 2.0 ** -8
        saved["zero_setting"] = {name: (bfp.zero_setting_error(distribute_tensor(w, mesh, [Shard(0)]), f),
                                        bfp.zero_setting_error(w, f))
                                 for name in ("e4m3", "fb16", "nvfp4") for f in [format_from_name(name)]}
        if int(os.environ["RANK"]) == 0:
            torch.save(saved, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "--ag":  # rounded all-gather: FORMAT OUT [PARAM_DTYPE]
        rounded_all_gather(*sys.argv[2:5])
    elif sys.argv[1] == "--ag-reference":  # FORMAT OUT WORLD [PARAM_DTYPE [ORDER]]
        torch.set_num_threads(1)
        torch.save(ag_reference(sys.argv[2], int(sys.argv[4]), *sys.argv[5:7]), sys.argv[3])
    elif sys.argv[1] == "--rs":  # rounded reduce-scatter: KIND ORDER FORMAT OUT [PRESET [TRANSPORT]]
        rounded_reduce_scatter(*sys.argv[2:8])
    elif sys.argv[1] == "--tp":  # tensor parallel: PRESET OUT
        tensor_parallel(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "--convert-sharded":  # one rank: converting after fully_shard is refused, saying why
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        import bfp
        dist.init_process_group("gloo")
        m = model("fp32")
        for block in m.blocks:
            fully_shard(block)
        fully_shard(m)
        try:
            bfp.convert(m, json.loads(sys.argv[2]) if sys.argv[2].startswith("{") else sys.argv[2])
        except ValueError as e:
            print(f"refused: {e}")
        dist.destroy_process_group()
    elif sys.argv[1] == "--rs-reference":  # ORDER FORMAT OUT WORLD [PRESET]
        torch.set_num_threads(1)
        torch.save(rs_reference(sys.argv[2], sys.argv[3], int(sys.argv[5]), *sys.argv[6:7]), sys.argv[4])
    elif sys.argv[1] == "--reference":
        torch.set_num_threads(1)
        torch.save(reference(sys.argv[2], int(sys.argv[4])), sys.argv[3])
    else:
        main(*sys.argv[1:])
