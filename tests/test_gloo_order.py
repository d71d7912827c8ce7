"""RoundedReduce(order="gloo") is bit for bit what real gloo adds: 3 and 4 processes,
torch.distributed all_reduce(SUM) of float16 and bfloat16 CPU tensors (random inputs of 1 to 100
elements, one rank's spike that overflows float16, and a buffer of several 1 MiB segments per
rank), against the [W, n] stack through the reference."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bfp.distributed.orders import gloo_chunks, gloo_order, gloo_segments
from bfp.distributed.reduce import RoundedReduce
from bfp.formats import Float
from gloo_cases import cases

ROOT = Path(__file__).resolve().parents[1]
FMT = {str(torch.float16): Float(5, 10, overflow="inf"), str(torch.bfloat16): Float(8, 7, overflow="inf")}


def test_gloo_segments_follow_allreduce_cc():
    assert gloo_segments(10, 3, 2) == (6, 2, 2)  # 10 elements over 3 ranks: chunks of 4, 4, 2
    assert gloo_chunks(10, 3, 2).tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    n = 3 * 2 ** 20  # 6 MiB of 2-byte elements: 6 segments of 1 MiB, rounded up to 2 W = 8 for W = 4
    assert gloo_segments(n, 4, 2) == (8, 2, n // 8)
    assert gloo_segments(5 * 2 ** 20, 3, 2) == (12, 4, -(-5 * 2 ** 20 // 12))
    assert gloo_order(0, 3) == [2, 1, 0] and gloo_order(1, 3) == [0, 2, 1] and gloo_order(2, 4) == [1, 0, 3, 2]


def test_the_worked_example_in_gloos_order():
    x = torch.tensor([[1.0] * 3, [0.0625] * 3, [0.0625] * 3])
    e4m3 = Float(4, 3)
    assert RoundedReduce(e4m3, order="gloo", average=False)(x).tolist() == [1.125, 1.125, 1.0]
    assert RoundedReduce(e4m3, order="ring", average=False)(x).tolist() == [1.0, 1.125, 1.0]


def test_block_formats_are_refused_for_a_librarys_flat_order():
    from bfp.formats import format_from_name
    with pytest.raises(ValueError, match="block format, whose tiles the cuts would split"):
        RoundedReduce(format_from_name("fb16"), order="gloo")


def _launch(world: int, *args) -> None:
    env = dict(os.environ, WORLD_SIZE=str(world), OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "_gloo_worker.py"), *map(str, args)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(world)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)


def test_a_ddp_run_with_pytorchs_fp16_compress_hook_equals_bfpsims_hook_in_gloos_order(tmp_path):
    _launch(3, tmp_path, "ddp")
    steps = torch.load(tmp_path / "ddp.pt")
    for i, (theirs, ours) in enumerate(steps):
        for a, b in zip(theirs, ours):
            assert torch.equal(a, b), f"step {i + 1}: {(a != b).sum()} of {a.numel()} parameters differ"
    assert not torch.equal(steps[0][0][0], steps[2][0][0])  # the steps changed the weights


@pytest.mark.parametrize("world", [3, 4])
def test_equals_real_gloo_bit_for_bit(tmp_path, world):
    _launch(world, tmp_path)
    got = torch.load(tmp_path / "results.pt")
    differs_from_per_parameter_ring = 0
    for name, stack in cases(world).items():
        for dtype, fmt in FMT.items():
            x = stack.to(getattr(torch, dtype.split(".")[1])).float()
            want = RoundedReduce(fmt, order="gloo", average=False)(x)
            real = got[(name, dtype)]
            assert torch.equal(want, real), f"{name} {dtype}: {(want != real).sum()} of {real.numel()} differ"
            differs_from_per_parameter_ring += not torch.equal(
                RoundedReduce(fmt, order="ring", average=False)(x), real)
    assert differs_from_per_parameter_ring > 0  # the older per-parameter order is not gloo's
    assert torch.isinf(got[("spike97", str(torch.float16))]).any()  # float16 overflowed, as IEEE does


def test_aps_shifts_each_parameter_of_a_flat_buffer_by_its_own_exponent():
    """A bucket holds a parameter with tiny gradients beside one with large ones: in e3m0 one shift
    for the whole buffer would flush the tiny one to zero; APS scales each tensor on its own."""
    from bfp.distributed.hook import reduce_flat
    g = torch.Generator().manual_seed(0)
    tiny, big = torch.rand(4, 6, generator=g) * 1e-4 + 1e-5, torch.rand(4, 10, generator=g) * 100 + 10
    stack = torch.cat([tiny, big], 1)
    e3m0 = Float(3, 0)
    red = RoundedReduce(e3m0, order="gloo", aps=True, average=False)
    got = reduce_flat(red, stack, [torch.Size([6]), torch.Size([10])], torch.empty(16))
    # The same buffer with the large parameter's gradients zeroed: gloo adds each element in the
    # same order (its chunks depend on the buffer's length only), so only a shared shift could differ.
    quiet = reduce_flat(red, torch.cat([tiny, torch.zeros_like(big)], 1), [torch.Size([6]), torch.Size([10])],
                        torch.empty(16))
    assert torch.equal(got[:6], quiet[:6]) and (got[:6] != 0).all()
    assert (red(stack)[:6] == 0).all()  # one shift for the whole buffer: the tiny parameter is lost


def _emulate(order: str, each_step):
    """One process emulating the 3 workers of ``bucket_case(order)`` for 3 steps; ``each_step(k,
    model, step)`` after step ``k``."""
    import torch.nn.functional as F
    from _gloo_worker import bucket_case
    from bfp.amp import MixedPrecision
    from bfp.distributed.emulated import EmulatedStep
    model, _, reduce, cap = bucket_case(0, order)
    per_rank = [bucket_case(r, order)[1] for r in range(3)]
    step = EmulatedStep(3, reduce, bucket_cap_mb=cap)
    opt, amp = torch.optim.SGD(model.parameters(), lr=0.1), MixedPrecision()
    for k in range(3):
        x = torch.cat([per_rank[r][k][0] for r in range(3)])
        y = torch.cat([per_rank[r][k][1] for r in range(3)])
        step(model, x, y, criterion=F.cross_entropy, optimizer=opt, amp=amp)
        each_step(k, model, step)
    return model, cap


def _same_params(real, order):
    def check(k, model, step):
        for a, b in zip(model.parameters(), real["params"][k]):
            assert torch.equal(a.detach(), b), (order, k)
    return check


@pytest.mark.parametrize("order", ["nccl-ring", "nccl-tree", "sequential", "param-ring"])
def test_emulated_workers_equal_ddp_processes_for_every_order(tmp_path, order):
    """As below for the other orders: one process emulating 3 workers equals 3 gloo processes
    under DDP with bfpsim's hook, bit for bit, over 3 steps (rebuilt buckets included)."""
    _launch(3, tmp_path, "buckets", order)
    _emulate(order, _same_params(torch.load(tmp_path / "buckets.pt"), order))


def test_emulated_workers_reduce_in_ddps_real_buckets_bit_for_bit(tmp_path, monkeypatch):
    """3 gloo processes under DDP (bfpsim's hook, gloo order, e4m3, 4 KiB buckets) against one
    process emulating the 3 workers: the same buckets at every step (one in parameters() order,
    then rebuilt in gradient-ready order) and the same parameters bit for bit."""
    from bfp.distributed.buckets import ddp_buckets
    _launch(3, tmp_path, "buckets")
    real = torch.load(tmp_path / "buckets.pt")
    params = _same_params(real, "gloo")

    def check(k, model, step):
        assert sorted(map(tuple, step.last_buckets)) == sorted(map(tuple, real["buckets"][k])), k
        params(k, model, step)
    model, cap = _emulate("gloo", check)
    assert len(real["buckets"][0]) == 1 and len(real["buckets"][1]) > 1  # rebuilt from the second step
    assert real["buckets"][1] != ddp_buckets(list(model.parameters()), list(range(6)), cap)  # ready order counts
    # with one bucket in parameters() order at every step (the old emulation) the sums differ
    import bfp.distributed.emulated as emulated
    monkeypatch.setattr(emulated, "ddp_buckets", lambda params, ready, cap: [list(range(len(params)))])
    model, _ = _emulate("gloo", lambda k, model, step: None)
    assert any(not torch.equal(a.detach(), b) for a, b in zip(model.parameters(), real["params"][2]))
