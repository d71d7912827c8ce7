"""Inputs of the gloo order test, built alike by the test and by every rank (tests/_gloo_worker.py)."""
import torch


def cases(world: int) -> dict:
    """name -> a [world, n] float32 stack whose rows are float16- and bfloat16-friendly values."""
    g = torch.Generator().manual_seed(1234 + world)
    out = {}
    for n in (1, 2, 3, 5, 7, 10, 16, 31, 64, 99, 100):
        out[f"random{n}"] = torch.randn(world, n, generator=g) * 4
    spike = torch.randn(world, 97, generator=g) * 1e-3
    spike[1, ::3] = 4e4  # one rank's spike, another's at the same places: the sum passes float16's top
    spike[2, ::6] = 4e4
    out["spike97"] = spike
    # several 1 MiB segments per rank for 2-byte elements: S = roundUp(ceil(n*2/2**20), W) > 2W
    big = 1_700_000 * world
    out["big"] = torch.randn(world, big, generator=g)
    return out
