"""DDP's buckets (bfp.distributed.buckets) against hand-derived tables; the real DDP comparison
is in tests/test_gloo_order.py (3 gloo processes)."""
import pytest
import torch

from bfp.cli.dist_run import backend_order
from bfp.distributed.buckets import ReadyOrder, bucket_limits, ddp_buckets
from bfp.distributed.reduce import RoundedReduce
from bfp.formats import Float, format_from_name


def _params(*numels, dtype=torch.float32):
    return [torch.zeros(n, dtype=dtype) for n in numels]


def test_first_iteration_is_one_bucket_in_parameters_order():
    assert ddp_buckets(_params(5, 300000, 7)) == [[0, 1, 2]]


def test_rebuilt_buckets_close_when_they_reach_the_limit_first_one_1_mib():
    p = _params(300000, 300000, 300000, 300000, 300000)  # 1.2 MB each: the first closes the 1 MiB bucket
    assert ddp_buckets(p, [0, 1, 2, 3, 4]) == [[0], [1, 2, 3, 4]]
    assert ddp_buckets(p, [4, 3, 2, 1, 0]) == [[4], [3, 2, 1, 0]]
    # 25 MiB later buckets: 6.6M elements (26.4 MB) close the second after its 6th parameter
    big = _params(*([1_100_000] * 8))
    assert ddp_buckets(big, list(range(8))) == [[0], [1, 2, 3, 4, 5, 6], [7]]


def test_a_set_cap_is_also_the_first_buckets_and_ready_order_is_kept_inside():
    p = _params(300000, 10, 200000, 5)            # 1.2 MB, 40 B, 0.8 MB, 20 B
    assert bucket_limits(0.5) == (524288, 524288)
    assert ddp_buckets(p, [3, 2, 1, 0], cap_mb=0.5) == [[3, 2], [1, 0]]
    assert ddp_buckets(p, [1, 3], cap_mb=0.5) == [[1, 3, 0], [2]]  # unready ones follow in order


def test_dtypes_get_buckets_of_their_own():
    p = _params(10, 10) + _params(10, dtype=torch.float16)
    assert sorted(ddp_buckets(p, [2, 0, 1], cap_mb=1)) == [[0, 1], [2]]


def test_bad_caps_and_orders_are_refused():
    for bad in (0, -1, float("nan"), "25", True):
        with pytest.raises(ValueError, match="bucket_cap_mb must be a number of MiB > 0"):
            bucket_limits(bad)
    with pytest.raises(ValueError, match="not a list of distinct indices"):
        ddp_buckets(_params(3, 3), [0, 0])


def test_ready_order_records_the_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    with ReadyOrder(list(model.parameters())) as r:
        model(torch.randn(2, 3)).sum().backward()
    assert sorted(r.order) == [0, 1, 2, 3] and r.order[0] in (2, 3)  # the last layer's gradients first


def test_auto_order_is_the_backends_and_ring_is_the_per_parameter_rings_old_name():
    assert backend_order(Float(4, 3), torch.device("cpu")) == "gloo"
    assert backend_order(None, torch.device("cuda")) == "nccl-ring"
    assert backend_order(format_from_name("fb16"), torch.device("cpu")) == "param-ring"
    assert RoundedReduce(Float(4, 3), order="ring").order == "param-ring"
