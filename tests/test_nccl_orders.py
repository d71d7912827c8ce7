"""NCCL's ring and tree orders (bfp.distributed.orders), checked against tables derived by hand
from NCCL's source (src/device/all_reduce.h runRing / runTreeUpDown, src/graph/trees.cc,
src/graph/connect.cc). No GPU here: benchmarks/nccl_check.py compares with a real NCCL."""
import pytest
import torch

from bfp.distributed.orders import (NcclOptions, btree, channel_parts, dtree, nccl_ring_groups, nccl_tree)
from bfp.distributed.reduce import RoundedReduce
from bfp.formats import Float


def test_btree_is_trees_cc_illustration():
    # 0 -> 8; 8 -> 4, 12; 4 -> 2, 6; 12 -> 10, 13; 2 -> 1, 3; 6 -> 5, 7; 10 -> 9, 11
    kids = {r: tuple(x for x in btree(14, r)[1:] if x != -1) for r in range(14)}
    assert kids == {0: (8,), 8: (4, 12), 4: (2, 6), 12: (10, 13), 2: (1, 3), 6: (5, 7), 10: (9, 11),
                    1: (), 3: (), 5: (), 7: (), 9: (), 11: (), 13: ()}
    assert [btree(14, r)[0] for r in (1, 3, 13, 12, 8)] == [2, 2, 12, 8, 0]


def test_the_second_tree_is_mirrored_for_even_and_shifted_for_odd_counts():
    # even (12): the mirror, rooted at 11 -> 3 -> (1, 7)  (trees.cc's second illustration: 3 under 11)
    assert dtree(12, 11, 1)[0] == -1 and dtree(12, 3, 1)[0] == 11
    assert sorted(x for x in dtree(12, 3, 1)[1:] if x != -1) == [1, 7]
    # odd (13): shifted by one, rooted at 1 -> 9 -> (5, 0)
    assert dtree(13, 1, 1)[0] == -1 and dtree(13, 9, 1)[0] == 1
    assert sorted(x for x in dtree(13, 9, 1)[1:] if x != -1) == [0, 5]


@pytest.mark.parametrize("world, nodes, tree, want", [
    (3, 1, 0, (0, ((1, ((2, ()),)),))),                                  # one node: the chain 0 <- 1 <- 2
    (4, 2, 0, (0, ((1, ()), (2, ((3, ()),))))),                          # head 0: own, chain child 1, node 1
    (4, 2, 1, (2, ((3, ()), (0, ((1, ()),))))),                          # mirrored: node 1's head is the root
    (6, 3, 0, (0, ((1, ()), (4, ((5, ()), (2, ((3, ()),))))))),          # nodes 0 -> 2 -> 1
    (6, 3, 1, (2, ((3, ()), (0, ((1, ()), (4, ((5, ()),))))))),          # shifted: nodes 1 -> 0 -> 2
    (8, 4, 0, (0, ((1, ()), (4, ((5, ()), (2, ((3, ()),)), (6, ((7, ()),))))))),
])
def test_tree_folds(world, nodes, tree, want):
    assert nccl_tree(world, nodes, tree) == want


@pytest.mark.parametrize("n, channels, es, want", [
    (100, 1, 2, [(0, 100)]),
    (100, 2, 2, [(0, 56), (56, 44)]),          # 13 units of 8 elements: 7 and 6
    (10, 2, 4, [(0, 8), (8, 2)]),              # 3 units of 4: 2 and 1, the last cut at n
    (3, 4, 2, [(0, 3)]),                       # one unit: the other channels get nothing
])
def test_channel_parts(n, channels, es, want):
    assert channel_parts(n, channels, es) == want


def _table(n, world, es, **kw):
    group, orders = nccl_ring_groups(n, world, es, NcclOptions(**kw))
    return [orders[g] for g in group.tolist()]


def test_ring_chunks_start_one_ring_index_after_their_own():
    # 48 float16 over 3 ranks: the last (only) block's chunkCount = alignUp(ceil(48/3), 16/2) = 16
    t = _table(48, 3, 2)
    assert t[:16] == [(1, 2, 0)] * 16 and t[16:32] == [(2, 0, 1)] * 16 and t[32:] == [(0, 1, 2)] * 16
    # 10 float16 over 4 ranks: chunkCount = alignUp(3, 8) = 8: chunk 0 has 8, chunk 1 has 2
    assert _table(10, 4, 2) == [(1, 2, 3, 0)] * 8 + [(2, 3, 0, 1)] * 2
    # a chunk of 8 elements (chunk_bytes 16): one full block of 3 x 8, then the last 16 elements as a
    # block of chunkCount alignUp(ceil(16/3), 8) = 8: two chunks, the third empty
    t = _table(40, 3, 2, chunk_bytes=16)
    assert t[:8] == [(1, 2, 0)] * 8 and t[8:16] == [(2, 0, 1)] * 8 and t[16:24] == [(0, 1, 2)] * 8
    assert t[24:32] == [(1, 2, 0)] * 8 and t[32:40] == [(2, 0, 1)] * 8
    # another ring order on the second of two channels: 0 3 1 2
    t = _table(64, 4, 2, channels=2, rings=[(0, 1, 2, 3), (0, 3, 1, 2)])
    assert t[0] == (1, 2, 3, 0) and t[32] == (3, 1, 2, 0) and t[40] == (1, 2, 0, 3)


@pytest.mark.parametrize("world", [3, 4, 5, 6, 7, 8])
def test_every_element_gets_every_rank_once_in_ring_order(world):
    for channels in (1, 2):
        group, orders = nccl_ring_groups(1000, world, 2, NcclOptions(channels=channels))
        assert all(sorted(o) == list(range(world)) for o in orders) and set(group.tolist()) == set(range(len(orders)))
        assert all(o[k + 1] == (o[k] + 1) % world for o in orders for k in range(world - 1))


def test_the_worked_example_in_ncclss_orders():
    x = torch.tensor([[1.0] * 48, [0.0625] * 48, [0.0625] * 48])
    ring = RoundedReduce(Float(4, 3), order="nccl-ring", average=False)(x)
    assert ring[::16].tolist() == [1.125, 1.0, 1.0]  # chunks started by b (b+c first), c, a
    tree = RoundedReduce(Float(4, 3), order="nccl-tree", average=False)(x)
    assert tree[::16].tolist() == [1.125, 1.125, 1.125]  # the chain: a + (b + c)


def test_two_channels_use_both_trees_and_kahan_is_refused_for_the_tree():
    # 3 nodes of 2 ranks, e4m3 (1-byte elements: 16-element units, so 32 elements = one unit per channel)
    x = torch.zeros(6, 32)
    x[0], x[2], x[4] = 1.0, 0.0625, 0.0625
    fmt = Float(4, 3)
    two = RoundedReduce(fmt, order="nccl-tree", average=False, nccl=NcclOptions(channels=2, nodes=3))(x)
    # channel 0, tree 0 (nodes 0 -> 2 -> 1): (x0 + x1) + ((x4 + x5) + (x2 + x3)) = 1 + (0.0625 + 0.0625) = 1.125
    # channel 1, tree 1 (nodes 1 -> 0 -> 2): (x2 + x3) + ((x0 + x1) + (x4 + x5)) = 0.0625 + (1 + 0.0625 -> 1.0) = 1.0
    assert two.tolist() == [1.125] * 16 + [1.0] * 16
    with pytest.raises(ValueError, match="Kahan"):
        RoundedReduce(fmt, order="nccl-tree", kahan=True)


def test_nccl_avg_premultiplies_each_rank_by_the_rounded_reciprocal():
    """divide='nccl-avg' is ncclAvg's PreMulSum: q(q(x) * q(1/N)) per rank, then the rounded sum;
    the expected values are numpy float16 arithmetic (src/enqueue.cc, reduce_kernel.h)."""
    import numpy as np
    fp16 = Float(5, 10, overflow="inf")
    g = torch.Generator().manual_seed(3)
    stack = torch.randn(3, 40, generator=g) * 10
    got = RoundedReduce(fp16, order="sequential", divide="nccl-avg")(stack)
    x = stack.numpy().astype(np.float16)
    s = np.float16(np.float32(1.0 / 3))
    assert float(s) == 0.333251953125
    want = (x[0] * s + x[1] * s) + x[2] * s   # numpy float16: each product and sum rounded to half
    assert torch.equal(got, torch.from_numpy(want.astype(np.float32)))
    before = RoundedReduce(fp16, order="sequential", divide="before")(stack)
    assert not torch.equal(got, before)  # 1/3 rounded to half is not 1/3
    two = torch.randn(4, 9, generator=g)  # N = 4: 1/4 is exact, so only q(x) differs from 'cast-first'
    assert torch.equal(RoundedReduce(fp16, order="sequential", divide="nccl-avg")(two),
                       RoundedReduce(fp16, order="sequential", divide="cast-first")(two))


def test_nccls_ring_reduce_scatter_starts_a_segment_after_its_owner_on_each_channels_ring():
    from bfp.distributed.orders import nccl_reduce_scatter_groups
    group, orders = nccl_reduce_scatter_groups(4, 3, 4)
    assert [orders[g] for g in group.tolist()] == [(1, 2, 0)] * 4 + [(2, 0, 1)] * 4 + [(0, 1, 2)] * 4
    # two channels of 4 elements a segment (16-byte units), the second around the ring 2, 1, 0
    group, orders = nccl_reduce_scatter_groups(8, 3, 4, NcclOptions(channels=2, rings=((0, 1, 2), (2, 1, 0))))
    seq = [orders[g] for g in group.tolist()]
    assert seq == ([(1, 2, 0)] * 4 + [(2, 1, 0)] * 4 + [(2, 0, 1)] * 4 + [(0, 2, 1)] * 4
                   + [(0, 1, 2)] * 4 + [(1, 0, 2)] * 4)


def test_fsdps_nccl_ring_reduce_scatter_adds_in_that_order_and_gloos_does_not():
    import torch
    from bfp import format_from_name
    from bfp.distributed.fsdp import RoundedReduceScatter
    fp16 = format_from_name("float16")
    # segment d: the rank after d holds 2048 (float16's spacing there is 2), the next two 1 each, d
    # itself 0. NCCL adds 2048 + 1 first (ties to even: 2048, twice); gloo adds 1 + 1 first (2050).
    world, n = 4, 2
    stack = torch.zeros(world, world * n)
    for d in range(world):
        for k, v in ((1, 2048.0), (2, 1.0), (3, 1.0)):
            stack[(d + k) % world, d * n:(d + 1) * n] = v

    def by_hand(order, seg):
        acc = stack[order[0], seg * n:(seg + 1) * n].half()
        for w in order[1:]:
            acc = (acc.float() + stack[w, seg * n:(seg + 1) * n]).half()
        return acc.float()
    shapes = [torch.Size([world, n])]
    got = RoundedReduceScatter(RoundedReduce(fp16, order="nccl-ring", average=False), shapes)._reduce(stack, world)
    want = torch.cat([by_hand([(d + 1 + k) % world for k in range(world)], d) for d in range(world)])
    assert torch.equal(got, want) and got.tolist() == [2048.0] * 8
    gloo = RoundedReduceScatter(RoundedReduce(fp16, order="gloo", average=False), shapes)._reduce(stack, world)
    assert gloo.tolist() == [2050.0] * 8  # the negative control: another order, another sum
