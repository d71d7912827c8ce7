"""Rounded gradient all-reduce: the reference sums, the DDP hook and emulated workers over 2 gloo
processes, APS, Kahan, LARS, the launcher environment and sharded data."""
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bfp.distributed import env as dist_env
from bfp.distributed.reduce import RoundedReduce, aps_shift, check_grad_format, ring_owner
from bfp.data import cifar as data_mod
from bfp.formats import Float, format_from_name
from bfp.formats.mx import MX
from bfp.kernels import quantize as bfp_quantize
from bfp.optim.lars import LARS

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "_dist_worker.py"
sys.path.insert(0, str(WORKER.parent))
import _dist_worker as worker  # noqa: E402  (the reductions the ranks run)
E4M3 = format_from_name("e4m3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, world=2, timeout=150):
    """Run ``tests/_dist_worker.py ARGS`` as ``world`` gloo ranks; fail on a non-zero exit or a hang."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, str(WORKER), *args], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
             for r in range(world)]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    return outs


# ---- the reference (single process) -------------------------------------------------------

def test_worked_example_ring_keeps_what_sequential_swamps():
    # the docstring's example: worker a = 1.0, workers b and c = 0.0625, in e4m3
    st = torch.stack([torch.ones(3), torch.full((3,), 0.0625), torch.full((3,), 0.0625)])
    seq = RoundedReduce(E4M3, order="sequential", average=False)(st)
    ring = RoundedReduce(E4M3, order="ring", average=False)(st)
    assert seq.tolist() == [1.0, 1.0, 1.0]
    assert ring.tolist() == [1.0, 1.125, 1.0]


def test_kahan_lowers_the_error_against_a_float64_sum():
    # 1 + 7 * 1/16 in e4m3: every plain partial sum 1 + 1/16 is a tie that rounds back to 1
    st = torch.tensor([[1.0]] + [[0.0625]] * 7)
    exact = st.double().sum().item()  # 1.4375
    plain = RoundedReduce(E4M3, order="sequential", average=False)(st).item()
    kahan = RoundedReduce(E4M3, order="sequential", average=False, kahan=True)(st).item()
    assert plain == 1.0
    assert kahan == 1.5  # the sum 1.4375 rounded to e4m3 (a tie between 1.375 and 1.5; to even)
    assert abs(kahan - exact) < abs(plain - exact)


def test_float32_format_is_the_plain_float32_sum_in_order():
    g = torch.randn(5, 7, 3, generator=torch.Generator().manual_seed(1))
    r = RoundedReduce(Float(8, 23), order="sequential", average=False)(g)
    expect = g[0]
    for k in range(1, 5):
        expect = expect + g[k]
    assert torch.equal(r, expect)


def test_ring_chunks_follow_whole_blocks_of_the_first_axis():
    assert ring_owner((5, 3), 2).tolist() == [0, 0, 0, 1, 1]
    fb = format_from_name("fb12")  # BlockFloat group (1, 24, 3, 3): one row per tile
    assert ring_owner((4, 24, 3, 3), 4, fb).tolist() == [0, 1, 2, 3]
    mx = MX(E4M3, block=4, axis=0)  # 1-D of 10: blocks of 4 rows -> 3 units over 2 chunks
    assert ring_owner((10,), 2, mx).tolist() == [0] * 8 + [1] * 2


def test_block_formats_round_each_worker_in_the_parameters_own_tiles():
    # regression: rounding the [workers, *shape] stack at once gave BlockFloat tiles (and MX blocks
    # along axis 0) that spanned the worker axis, sharing one scale between workers
    st = torch.randn(2, 8, 4, 3, 3, generator=torch.Generator().manual_seed(0))
    st[1] *= 1000.0  # worker 1's scale would flush worker 0's values in a shared tile
    for fmt in (format_from_name("fb16"), MX(E4M3, block=4, axis=0)):
        q = lambda t: bfp_quantize(t, fmt)  # noqa: E731
        assert torch.equal(RoundedReduce(fmt, average=False)(st), q(q(st[0]) + q(st[1]))), fmt


def test_aps_shift_sends_the_largest_sum_to_the_top_exponent():
    st = torch.full((2, 3), 1e-8)
    assert aps_shift(st, E4M3) == 8 + 25  # e4m3's emax is 8; ceil(log2(1e-8 * 2 workers)) = -25
    plain = RoundedReduce(E4M3, average=False)
    out = RoundedReduce(E4M3, aps=True, average=False)(st)
    assert torch.equal(out, plain(st * 2.0 ** 33) * 2.0 ** -33)
    assert out.count_nonzero().item() == 3 and plain(st).count_nonzero().item() == 0


def test_aps_leaves_zero_and_non_finite_gradients_unshifted():
    zeros = torch.zeros(2, 4)
    assert torch.equal(RoundedReduce(E4M3, aps=True)(zeros), torch.zeros(4))
    bad = torch.tensor([[1.0, float("nan")], [1e-8, 2.0]])
    out = RoundedReduce(Float(5, 2), aps=True, average=False)(bad)
    assert out[0].item() == 1.0 and math.isnan(out[1].item())  # 1e-8 below e5m2: flushed, as unshifted


def test_stochastic_rounding_and_impossible_shapes_are_refused():
    with pytest.raises(ValueError, match="stochastic rounding cannot be a gradient format"):
        check_grad_format(Float(4, 3, rounding="stochastic"))
    with pytest.raises(ValueError, match=r"cannot round a gradient of shape \[4\]"):
        check_grad_format(MX(E4M3, axis=1), [(4, 3), (4,)])
    with pytest.raises(ValueError, match="reduction order 'tree'"):
        RoundedReduce(E4M3, order="tree")
    with pytest.raises(ValueError, match=r"at least one worker .*got a stack of shape \[0, 3\]"):
        RoundedReduce(E4M3)(torch.zeros(0, 3))


# ---- LARS -----------------------------------------------------------------------------------

def test_lars_step_follows_its_formula():
    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))  # ||w|| = 5
    b = torch.nn.Parameter(torch.tensor([1.0, -1.0]))  # 1-D: not adapted
    opt = LARS([w, b], lr=0.5, momentum=0.9, weight_decay=0.1, trust_coefficient=0.01)
    w.grad, b.grad = torch.tensor([[0.0, 2.0]]), torch.tensor([0.5, 0.5])  # ||g|| = 2
    opt.step()
    trust = 0.01 * 5.0 / (2.0 + 0.1 * 5.0)
    d1 = trust * (torch.tensor([[0.0, 2.0]]) + 0.1 * torch.tensor([[3.0, 4.0]]))
    assert torch.allclose(w.detach(), torch.tensor([[3.0, 4.0]]) - 0.5 * d1, rtol=0, atol=1e-7)
    assert torch.allclose(b.detach(), torch.tensor([1.0, -1.0]) - 0.5 * (torch.tensor([0.5, 0.5])
                                                                         + 0.1 * torch.tensor([1.0, -1.0])))
    w_before = w.detach().clone()
    opt.step()  # momentum: v = 0.9 * d1 + d2
    trust2 = 0.01 * w_before.norm() / (2.0 + 0.1 * w_before.norm())
    d2 = trust2 * (torch.tensor([[0.0, 2.0]]) + 0.1 * w_before)
    assert torch.allclose(w.detach(), w_before - 0.5 * (0.9 * d1 + d2), rtol=0, atol=1e-6)


def test_lars_zero_gradient_norm_falls_back_to_trust_one():
    assert LARS.trust_ratio(torch.ones(2, 2), torch.zeros(2, 2), 0.0, 0.001).item() == 1.0


# ---- launcher environment -------------------------------------------------------------------

def test_env_reads_torchrun_and_slurm_variables():
    e = dist_env.read_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h",
                           "MASTER_PORT": "1234"})
    assert (e.rank, e.world_size, e.local_rank, e.master_addr, e.master_port) == (1, 4, 1, "h", "1234")
    s = dist_env.read_env({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                           "MASTER_ADDR": "node01"})
    assert (s.rank, s.world_size, s.local_rank, s.master_port, s.source) == (9, 16, 1, "29500", "Slurm (srun)")
    assert not dist_env.read_env({}).distributed
    assert not dist_env.read_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).distributed


def test_env_errors_name_what_to_set():
    with pytest.raises(dist_env.DistEnvError, match="MASTER_ADDR is not set"):
        dist_env.read_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    with pytest.raises(dist_env.DistEnvError, match="set both RANK and WORLD_SIZE"):
        dist_env.read_env({"RANK": "0"})
    with pytest.raises(dist_env.DistEnvError, match="need 0 <= rank < world size"):
        dist_env.read_env({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})


def test_backend_is_gloo_on_cpu_nccl_on_cuda_unless_overridden(monkeypatch):
    monkeypatch.delenv("BFP_DIST_BACKEND", raising=False)
    assert dist_env.backend_for(torch.device("cpu")) == "gloo"
    assert dist_env.backend_for(torch.device("cuda", 0)) == "nccl"
    monkeypatch.setenv("BFP_DIST_BACKEND", "mpi")
    assert dist_env.backend_for(torch.device("cpu")) == "mpi"


# ---- sharded data ---------------------------------------------------------------------------

def test_rank_slices_of_a_global_batch_are_the_single_process_batch():
    def batches(rank, world):
        d = data_mod.load("digits", batch_size_train=8, batch_size_test=10, seed=3, limit_train=32,
                          limit_test=15, rank=rank, world=world)
        return list(d.train), list(d.test)
    (train, test), (t0, e0), (t1, e1) = batches(0, 1), batches(0, 2), batches(1, 2)
    assert len(train) == len(t0) == len(t1) == 4
    for full, a, b in zip(train, t0, t1):
        assert torch.equal(full[0], torch.cat([a[0], b[0]])) and torch.equal(full[1], torch.cat([a[1], b[1]]))
    assert sum(len(y) for _, y in e0) + sum(len(y) for _, y in e1) == 15


def test_emulated_workers_drop_an_incomplete_last_global_batch():
    one = data_mod.load("digits", batch_size_train=32, limit_train=70)
    two = data_mod.load("digits", batch_size_train=32, limit_train=70, workers=2)
    assert [len(y) for _, y in one.train] == [32, 32, 6]
    assert [len(y) for _, y in two.train] == [32, 32]


def test_a_global_batch_that_does_not_split_over_ranks_is_refused():
    with pytest.raises(data_mod.DataError, match="`batch_size_train` 9 .* over 2 processes"):
        data_mod.load("digits", batch_size_train=9, rank=0, world=2)


# ---- two gloo processes ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def hook_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("hook")
    launch(["hook", str(out)])
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_hook_equals_the_single_process_reference_bit_for_bit(hook_results):
    r0, r1 = hook_results
    for name, cfg in worker.CONFIGS.items():
        red = worker.reduction(cfg)
        for i, (g0, g1) in enumerate(zip(r0["local"][name], r1["local"][name])):
            ref = red(torch.stack([g0, g1]))
            assert torch.equal(r0["hook"][name][i], ref), (name, i)
            assert torch.equal(r1["hook"][name][i], ref), (name, i)


def test_hook_in_float32_equals_ddps_plain_all_reduce(hook_results):
    r0, _ = hook_results
    assert all(torch.equal(a, b) for a, b in zip(r0["hook"]["fp32"], r0["plain"]))


def test_aps_keeps_small_gradients_that_e4m3_and_e5m2_flush(hook_results):
    tiny = hook_results[0]["tiny"]
    for fmt in ("e4m3", "e5m2"):
        assert tiny[f"{fmt}_apsFalse"].count_nonzero().item() == 0
        assert tiny[f"{fmt}_apsTrue"].count_nonzero().item() == 8
    # APS: 1e-8 * (1.75 + 1.875) / 2 rounded to e4m3's 3 mantissa bits at the top binade
    assert tiny["e4m3_apsTrue"][0, 3].item() == pytest.approx(1e-8 * 1.8125, rel=2 ** -4)


def test_four_workers_over_two_processes_reduce_as_the_reference_in_both_orders(hook_results):
    r0, r1 = hook_results
    workers = r0["workers"] + r1["workers"]  # rank 0's two workers, then rank 1's
    results = {}
    for order in ("ring", "sequential"):
        red = RoundedReduce(E4M3, order=order)
        rows = torch.cat([r0["gathered"][order], r1["gathered"][order]])  # 4 workers, rank-major
        off = 0
        for i in range(len(workers[0])):
            n = workers[0][i].numel()
            gathered = rows[:, off:off + n].reshape(4, *workers[0][i].shape)
            off += n
            # the step's own worker gradients, checked against each worker's separately computed
            # gradient (backward's own rounding may differ in the last bits)
            assert torch.allclose(gathered, torch.stack([w[i] for w in workers]), rtol=1e-4, atol=1e-6)
            ref = red(gathered)
            assert torch.equal(r0["emulated"][order][i], ref), (order, i)
            assert torch.equal(r1["emulated"][order][i], ref), (order, i)
        results[order] = r0["emulated"][order]
    assert any(not torch.equal(a, b) for a, b in zip(results["ring"], results["sequential"]))


# ---- the ring over 2, 3 and 4 gloo processes ------------------------------------------------

@pytest.mark.parametrize("world,local", [(2, 1), (3, 1), (4, 1), (3, 2), (2, 4)])
def test_ring_allreduce_equals_the_reference_and_sends_a_rings_bytes(tmp_path, world, local):
    """W = processes x emulated workers = 2, 3, 4, 6, 8: every rank ends with the reference's
    bits; traffic per rank is a ring's (for one worker per process)."""
    launch(["ring", str(tmp_path), str(local)], world=world, timeout=300)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    shapes = worker.RING_SHAPES
    workers = [w for r in ranks for w in r["workers"]]  # rank-major: worker r * E + w
    for name, cfg in worker.RING_CONFIGS.items():
        red = worker.reduction(cfg)
        off = 0
        for i, shape in enumerate(shapes):
            n = int(torch.Size(shape).numel())
            ref = red(torch.stack([w[i] for w in workers])).reshape(-1)
            for r in ranks:
                got = r["ring"][name][off:off + n]
                assert torch.equal(got.view(torch.int32), ref.view(torch.int32)), (name, shape, r is ranks[0])
            off += n
        # traffic per rank: 2 (W-1)/W of the bucket, Kahan's compensation adds (W-1)/W (checked where
        # chunks are single rows; whole tiles of these small tensors split unevenly)
        ideal = 2 * (world - 1) / world * ranks[0]["numel"] * 4
        factor = 1.5 if red.kahan else 1.0
        for r in ranks if local == 1 and (red.fmt is None or isinstance(red.fmt, Float)) else ():
            assert r["bytes"][name] <= 1.1 * factor * ideal + 4 * 4 * len(shapes), (name, r["bytes"][name], ideal)
            assert r["bytes"][name] >= 0.5 * factor * ideal


def test_emulated_ring_in_one_process_equals_the_reference():
    """One process, 5 emulated workers: the ring schedule with every visit local."""
    from bfp.distributed.ring import ring_reduce_workers
    g = torch.Generator().manual_seed(3)
    shapes = [torch.Size(s) for s in worker.RING_SHAPES]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(5)]
    rows = torch.stack([torch.cat([t.reshape(-1) for t in w]) for w in grads])
    for name, cfg in worker.RING_CONFIGS.items():
        red = worker.reduction(cfg)
        flat, sent = ring_reduce_workers(red, rows.clone(), shapes)  # the ring consumes its rows
        assert sent == 0
        off = 0
        for i, s in enumerate(shapes):
            ref = red(torch.stack([w[i] for w in grads])).reshape(-1)
            assert torch.equal(flat[off:off + s.numel()].view(torch.int32), ref.view(torch.int32)), (name, s)
            off += s.numel()
