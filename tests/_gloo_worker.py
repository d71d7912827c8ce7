"""One rank of tests/test_gloo_order.py: real torch.distributed all_reduce(SUM) with the gloo
backend on float16 and bfloat16 CPU tensors; rank 0 saves every result to OUT/results.pt.

    python tests/_gloo_worker.py OUT      (RANK, WORLD_SIZE set; a file store in OUT)
    python tests/_gloo_worker.py OUT ddp  3 SGD steps of one model under DDP with PyTorch's
                                          fp16_compress_hook and of its twin with bfpsim's hook
                                          (gloo order, float16 transport, divide cast-first);
                                          rank 0 saves both models' parameters after each step
    python tests/_gloo_worker.py OUT buckets [ORDER]  3 steps of bfpsim's DDPStep (gloo order, e4m3, small
                                          buckets); rank 0 saves the buckets DDP handed the hook
                                          and the parameters after each step
"""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gloo_cases import cases  # noqa: E402  (the inputs, built alike by the test)


def ddp_steps(out: Path) -> None:
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bfp.distributed.hook import RoundedHookState, rounded_allreduce_hook
    from bfp.distributed.reduce import RoundedReduce
    from bfp.formats import Float
    rank = dist.get_rank()
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(nn.Sequential(nn.Linear(40, 300), nn.Tanh(), nn.Linear(300, 7)))
    theirs, ours = (DDP(m, bucket_cap_mb=0.05) for m in models)  # several buckets
    theirs.register_comm_hook(None, fp16_compress_hook)
    ours.register_comm_hook(RoundedHookState(RoundedReduce(Float(5, 10, overflow="inf"), order="gloo",
                                                           divide="cast-first")), rounded_allreduce_hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (theirs, ours)]
    g = torch.Generator().manual_seed(100 + rank)
    steps = []
    for _ in range(3):
        x = torch.randn(16, 40, generator=g)
        for m, opt in zip((theirs, ours), opts):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
        steps.append([[p.detach().clone() for p in m.parameters()] for m in (theirs, ours)])
    if rank == 0:
        torch.save(steps, out / "ddp.pt")


def bucket_case(rank: int, order: str = "gloo"):
    """The model, its inputs on ``rank`` (3 steps) and the reduction of the bucket test."""
    import torch.nn as nn
    from bfp.distributed.reduce import RoundedReduce
    from bfp.formats import Float
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 40), nn.Tanh(), nn.Linear(40, 30), nn.Tanh(), nn.Linear(30, 5))
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(6, 20, generator=g), torch.randint(0, 5, (6,), generator=g)) for _ in range(3)]
    return model, batches, RoundedReduce(Float(4, 3), order=order), 0.004


def ddp_buckets_run(out: Path, order: str = "gloo") -> None:
    from bfp.amp import MixedPrecision
    from bfp.distributed import hook
    from bfp.distributed.ddp import DDPStep
    rank = dist.get_rank()
    model, batches, reduce, cap = bucket_case(rank, order)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    seen = []
    real_hook = hook.rounded_allreduce_hook

    def recording(state, bucket):
        seen[-1].append([index[id(p)] for p in bucket.parameters()])
        return real_hook(state, bucket)
    hook.rounded_allreduce_hook = recording
    import bfp.distributed.ddp as ddp_mod
    ddp_mod.rounded_allreduce_hook = recording
    step = DDPStep(reduce, torch.device("cpu"), bucket_cap_mb=cap)
    wrapped = step.prepare(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp, after = MixedPrecision(), []
    for x, y in batches:
        seen.append([])
        step(wrapped, x, y, criterion=torch.nn.functional.cross_entropy, optimizer=opt, amp=amp)
        after.append([p.detach().clone() for p in model.parameters()])
    if rank == 0:
        torch.save({"buckets": seen, "params": after}, out / "buckets.pt")


def _finish() -> None:
    """Leave together and skip the interpreter's teardown: a rank that destroyed its group while
    another still ran DDP's last collective, or a gloo/DDP thread left joinable when C++ statics
    are destroyed, ends in std::terminate ("terminate called without an active exception", exit
    code -6, seen on CI) although every result was saved."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> int:
    out = Path(sys.argv[1])
    # a file store in OUT: no port to race for with other tests
    dist.init_process_group("gloo", init_method=f"file://{out / 'store'}", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    if sys.argv[2:3] in (["ddp"], ["buckets"]):
        ddp_steps(out) if sys.argv[2] == "ddp" else ddp_buckets_run(out, *sys.argv[3:4])
        _finish()
    world, rank = dist.get_world_size(), dist.get_rank()
    results = {}
    for name, stack in cases(world).items():
        for dtype in (torch.float16, torch.bfloat16):
            t = stack[rank].to(dtype).clone()
            dist.all_reduce(t)
            results[(name, str(dtype))] = t.float()
    if rank == 0:
        torch.save(results, out / "results.pt")
    _finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
