"""Huge-page advice for fresh quantize outputs: which range is advised, when, and that results do not change."""
import pytest
import torch

import bfp
from bfp.kernels.numba_cpu import pages


@pytest.fixture
def calls(monkeypatch):
    """Record madvise calls instead of making them."""
    seen = []
    monkeypatch.setattr(pages, "_madvise", lambda: lambda addr, n, advice: seen.append((addr, n, advice)))
    return seen


class FakeTensor:
    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.nbytes // 4

    def element_size(self):
        return 4


H = pages.HUGE


def test_advises_only_the_whole_huge_pages_inside_the_buffer(calls):
    pages.advise(FakeTensor(3 * H + 64, 6 * H))       # ends at 9 H + 64
    assert calls == [(4 * H, 5 * H, 14)]
    pages.advise(FakeTensor(2 * H, 4 * H))            # aligned: all of it
    assert calls[-1] == (2 * H, 4 * H, 14)


def test_small_outputs_and_off_blocks_are_not_advised(calls):
    pages.advise(FakeTensor(4 * H, pages.MIN_BYTES - 4))
    with pages.off():
        pages.advise(FakeTensor(4 * H, 8 * H))
    assert calls == []
    pages.advise(FakeTensor(4 * H, 8 * H))
    assert calls == [(4 * H, 8 * H, 14)]


def test_environment_turns_it_off(monkeypatch):
    pages._madvise.cache_clear()
    monkeypatch.setenv("BFP_HUGEPAGES", "0")
    try:
        assert pages._madvise() is None
    finally:
        monkeypatch.delenv("BFP_HUGEPAGES")
        pages._madvise.cache_clear()


@pytest.mark.parametrize("fmt", [bfp.format_from_name("float8_e4m3fn"), bfp.BlockFloat(8, [1, 24, 3, 3], "nearest")],
                         ids=repr)
def test_quantize_bits_do_not_depend_on_the_advice(fmt):
    x = torch.randn(4, 64, 96, 96, generator=torch.Generator().manual_seed(0))  # 9 MiB: advised
    assert x.numel() * 4 >= pages.MIN_BYTES
    advised = bfp.quantize(x, fmt)
    with pages.off():
        plain = bfp.quantize(x, fmt)
    assert torch.equal(advised.view(torch.int32), plain.view(torch.int32))
