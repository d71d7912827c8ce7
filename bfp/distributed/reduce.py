"""Rounded gradient reductions: what N workers with narrow adders compute.

``RoundedReduce(fmt, order=, aps=, kahan=, average=, divide=)`` sums the
gradients of N workers, ``stack[w]`` being worker ``w``'s gradient of one
parameter, the way hardware whose adders hold ``fmt`` would:

1. ``average`` with ``divide="before"`` (the default: the sum of N averages
   cannot overflow where the gradients did not): every gradient is divided by
   N in float32. ``divide="cast-first"`` is PyTorch's ``fp16_compress_hook``
   exactly (``buffer.to(float16).div_(world_size)``): each gradient rounded to
   ``fmt``, divided by N in float32, then rounded again in step 3.
   ``divide="nccl-avg"`` is NCCL's ``ncclAvg`` for floating types (``src/enqueue.cc``,
   ``hostToDevRedOp``: ``ncclDevPreMulSum`` with the scalar ``__float2half(float(1.0 /
   nRanks))``, resp. bf16/fp8/float; ``src/device/reduce_kernel.h``, ``Apply_PreOp``:
   ``__hmul(x, scalar)`` as each rank's value enters the reduction): each gradient rounded
   to ``fmt``, multiplied by ``q(1/N)`` (1/N in float32, then rounded to ``fmt``; the product
   exact in float32 for formats of at most 11 significant bits, as half's is) and rounded
   again. For N not a power of two ``q(1/N) != 1/N``: every average is off by that factor's
   rounding (fp16 with N = 3: 0.33325195 instead of 1/3).
2. ``aps``: every value is multiplied by ``2**s``, one shift per parameter,
   ``s = top - ceil(log2(max|v| * N))`` with the max over all workers (CPD's
   auto precision scaling; the max is what CPD all-reduces with MAX), so the
   largest possible sum lands at the top of the format: ``top`` is
   ``fmt.emax`` for a ``Float``, 0 for ``BlockFloat``/``MX`` (whose shared
   scales make them shift-invariant up to their scale range). A parameter
   whose gradients are all zero, or hold NaN/Inf, is not shifted. The shift
   is exact in float32 (powers of two, applied in steps of at most 2**120),
   except that values shifted into float32's subnormal range round
   (nearest-even).
3. every worker's value is rounded to ``fmt`` (``bfp.quantize`` in the
   gradient's own shape, so ``BlockFloat`` tiles and ``MX`` blocks are those
   of the parameter).
4. the N rounded values are added in ``order``, every partial sum computed
   in float32 and rounded to ``fmt`` (two values of a format with at most 23
   mantissa bits add exactly in float32 unless their exponents differ by more
   than ``23 - man``; then float32 rounds first, a double rounding, as CPD's
   float32 emulation did). ``kahan``: compensated summation, every operation
   (``y = t - c``, ``s + y``, ``(s' - s) - y``) rounded to ``fmt``, the
   compensation living in the same narrow registers.
5. the sum is shifted back by ``2**-s`` (float32; exact unless the result is
   float32-subnormal) and, for ``divide="after"``, divided by N.

Overflow, subnormals and NaN/Inf follow ``fmt`` at every rounding (a
``Float`` saturates by default, an IEEE one with ``overflow="inf"`` gives
Inf); a NaN or Inf gradient propagates into the sum as in a float32
all-reduce. ``fmt=None`` sums in float32 (no rounding) in the same order.

The two orders, for N = 3 workers with gradients ``a, b, c`` (``q`` = round
to ``fmt``) and the parameter cut into 3 chunks along its first axis:

* ``sequential`` (CPD: gather, then add in rank order), every element:
  ``q(q(q(a) + q(b)) + q(c))``.
* ``param-ring`` (formerly ``ring``, still accepted: bfpsim's own per-parameter ring, the
  reduce-scatter of a ring all-reduce run on each parameter separately; chunk ``k`` starts at
  worker ``k`` and travels once round the ring, each worker adding its own chunk to what it
  received; no library cuts so, but it keeps block formats' tiles whole)::

      chunk 0: q(q(q(a0) + q(b0)) + q(c0))      a -> b -> c
      chunk 1: q(q(q(b1) + q(c1)) + q(a1))      b -> c -> a
      chunk 2: q(q(q(c2) + q(a2)) + q(b2))      c -> a -> b

  Worked example in e4m3 (3 mantissa bits; at 1.0 its step is 0.125):
  ``a = 1.0`` everywhere, ``b = c = 0.0625``. Sequential: ``1 + 0.0625``
  is a tie and rounds to even, 1.0, twice: every chunk sums to 1.0.
  Ring: chunk 0 gives 1.0 as above; chunk 1 adds ``0.0625 + 0.0625 = 0.125``
  first, then ``1.125``; chunk 2 starts ``0.0625 + 1`` and gives 1.0. Result
  ``[1.0, 1.125, 1.0]`` against the float64 sum 1.125 everywhere: the order
  decides whether small contributions survive. With ``kahan`` the sequential
  order gives 1.125 everywhere (the lost 0.0625 is carried and added back).

  Chunks are ``torch.tensor_split`` of the first axis into N parts, in
  units of whole ``BlockFloat`` tiles / ``MX`` blocks along that axis, so
  no tile straddles two chunks and rounding the whole tensor equals rounding
  each chunk where its worker holds it. With N = 2 both orders are equal
  (float addition commutes).

* ``gloo``: what gloo's ring all-reduce adds (``bfp.distributed.orders``, from
  ``gloo/allreduce.cc``): the *flat* tensor cut into segments of at most 1 MiB, chunk
  ``c`` (P consecutive segments) started by worker ``c - 1`` and added by ``c - 2``,
  ``c - 3``, ..., ending at worker ``c``; each partial sum rounded to ``fmt``, whose
  storage size (1, 2 or 4 bytes) sets the segment length. For ``Float`` formats only (a
  block format's tiles would straddle the cuts). Bit for bit real gloo's ``all_reduce``
  of float16/bfloat16 tensors with ``Float(5, 10, overflow="inf")`` / ``Float(8, 7,
  overflow="inf")`` (``tests/test_gloo_order.py``, 3 and 4 processes).

Every worker ends with the same sum (an all-reduce); the functions here are
the single-process reference that the DDP hook and the emulated workers both
call on the gathered gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from .. import overflow
from ..formats import Format, Rounding
from ..kernels import quantize
from ..kernels.plan import tile_for
from .orders import NcclOptions, channel_parts, element_bytes, gloo_chunks, nccl_ring_groups, nccl_tree

ORDERS = ("param-ring", "sequential", "gloo", "nccl-ring", "nccl-tree")
ORDER_ALIASES = {"ring": "param-ring"}  # the per-parameter ring's name before the libraries' orders came
LIBRARY_ORDERS = ("gloo", "nccl-ring", "nccl-tree")  # on the flat buffer, as the library cuts it
DIVIDE = ("before", "after", "cast-first", "nccl-avg")


def check_grad_format(fmt: Optional[Format], shapes=(), stochastic: bool = False) -> None:
    """Refuse formats a gradient reduction cannot use, naming why.

    Stochastic rounding is refused unless ``stochastic``: in an all-reduce every
    worker computes the reduction itself and must draw identical random bits,
    which nothing synchronises; where each element's sum is computed by one
    process only (FSDP's all-to-all reduce-scatter: ``RoundedReduce(...,
    one_reducer=True)``) it is allowed. ``shapes`` (of the parameters) are tried
    once, so an ``MX`` axis a bias does not have fails now rather than at the first step.
    """
    if fmt is None:
        return
    if not isinstance(fmt, Format):
        raise ValueError(f"gradient format must be a bfp Float, BlockFloat or MX, got {fmt!r}")
    if fmt.rounding is Rounding.STOCHASTIC and not stochastic:
        raise ValueError(f"gradient format {fmt!r}: stochastic rounding cannot be a gradient format where every "
                         f"worker computes the reduction (the workers' random draws are not synchronised); use "
                         f"rounding nearest or truncate, or FSDP's all-to-all reduce-scatter, where one rank "
                         f"reduces each shard (RoundedReduce(..., one_reducer=True))")
    for shape in sorted({tuple(s) for s in shapes}):
        try:
            quantize(torch.zeros(shape), fmt)
        except (ValueError, IndexError) as e:
            raise ValueError(f"gradient format {fmt!r} cannot round a gradient of shape {list(shape)}: {e}") from None


def ring_owner(shape: tuple[int, ...], n: int, fmt: Optional[Format] = None) -> torch.Tensor:
    """Chunk index (= the worker a ring starts that chunk at) of every row of axis 0."""
    rows = shape[0] if shape else 1
    unit = fmt.tile_rows(shape) if fmt is not None else 1
    units = -(-rows // unit)
    owner_of_unit = torch.cat([torch.full((len(part),), k, dtype=torch.long)
                               for k, part in enumerate(torch.tensor_split(torch.arange(units), n))])
    return owner_of_unit.repeat_interleave(unit)[:rows]


def _shift_up(x: torch.Tensor, s: int) -> torch.Tensor:
    """``x * 2**s`` in float32 steps of at most 2**120 (each exact until subnormal)."""
    while s:
        step = max(-120, min(120, s))
        x = x * (2.0 ** step)
        s -= step
    return x


def _segments(v: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """The parameters of a flat buffer (``v``: [N, ...] seen flat per row), one after another."""
    return list(torch.split(v.reshape(v.shape[0], -1), sizes, dim=1))


def _shift_segments(v: torch.Tensor, sizes: list[int], shifts: list[int]) -> torch.Tensor:
    """``v`` with each segment of its flat rows times ``2**shift`` (``_shift_up``), in ``v``'s shape."""
    if not any(shifts):
        return v
    parts = [_shift_up(p, s) for p, s in zip(_segments(v, sizes), shifts)]
    return torch.cat(parts, 1).reshape(v.shape)


def aps_shift(stack: torch.Tensor, fmt: Optional[Format]) -> int:
    """The APS exponent shift of one parameter (0 for all-zero or non-finite gradients)."""
    amax = stack.abs().max().double().item() if stack.numel() else 0.0
    return aps_shift_of(amax, stack.shape[0], fmt)


def aps_shift_of(amax: float, n: int, fmt: Optional[Format]) -> int:
    """The APS shift of a parameter whose largest gradient magnitude over the ``n`` workers is
    ``amax`` (a float32 value; what CPD all-reduces with MAX): ``top - ceil(log2(amax * n))``, 0
    for 0 or a non-finite amax."""
    if amax == 0.0 or not math.isfinite(amax):
        return 0
    m, e = math.frexp(amax * n)  # exact: float32 max times a small integer
    need = e - 1 if m == 0.5 else e          # ceil(log2(amax * N))
    top = fmt.aps_top() if fmt is not None else 0
    return top - need


def _by_groups(terms: torch.Tensor, group: torch.Tensor, orders: list) -> list[torch.Tensor]:
    """The addends in order when flat element ``i`` is added by the workers ``orders[group[i]]``."""
    n = terms.shape[0]
    flat = terms.reshape(n, -1)
    worker = torch.tensor(orders, dtype=torch.long, device=flat.device)[group.to(flat.device)]
    cols = torch.arange(flat.shape[1], device=flat.device)
    return [flat[worker[:, k], cols].reshape(terms.shape[1:]) for k in range(n)]


@dataclass(frozen=True)
class RoundedReduce:
    """A rounded N-worker gradient reduction (see the module docstring)."""

    fmt: Optional[Format] = None
    order: str = "param-ring"
    aps: bool = False
    kahan: bool = False
    average: bool = True
    divide: str = "before"
    nccl: NcclOptions = NcclOptions()  # channels, protocol, nodes, rings of the NCCL orders
    one_reducer: bool = False  # each element's sum computed by one process only: stochastic formats allowed
    generator: Optional[torch.Generator] = field(default=None, compare=False, repr=False)  # stochastic draws

    def __post_init__(self):
        object.__setattr__(self, "order", ORDER_ALIASES.get(self.order, self.order))
        if self.order not in ORDERS:
            raise ValueError(f"reduction order {self.order!r}: allowed {', '.join(ORDERS)}")
        if self.order in LIBRARY_ORDERS:
            element_bytes(self.fmt)  # a block format cannot ride a library's flat cuts: refused here
        if self.order == "nccl-tree" and self.kahan:
            raise ValueError("Kahan summation runs along one chain of adds; the nccl-tree order adds partial sums "
                             "of subtrees: use another order with Kahan")
        if self.divide not in DIVIDE:
            raise ValueError(f"divide {self.divide!r}: allowed {', '.join(DIVIDE)}")
        check_grad_format(self.fmt, stochastic=self.one_reducer)

    def _q(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.fmt is None else quantize(t, self.fmt, generator=self.generator)

    def _q_workers(self, stack: torch.Tensor) -> torch.Tensor:
        """Round every worker's gradient (row of ``stack``) in the parameter's own shape.
        Why not the stack at once: a ``BlockFloat``'s tiles (and an ``MX`` block along
        axis 0) would follow the stack's extra worker axis and share scales across
        workers; a ``Float`` rounds element by element, so one call is the same."""
        if self.fmt is None or self.fmt.elementwise:
            return self._q(stack)
        return torch.stack([self._q(row) for row in stack.unbind(0)])

    def __call__(self, stack: torch.Tensor, sizes: Optional[list[int]] = None, *, groups=None,
                 shifts: Optional[list[int]] = None) -> torch.Tensor:
        """Reduce ``stack`` ([N, *shape] float32, one row per worker) to ``shape``. ``sizes``: the
        stack is a flat buffer ([N, sum(sizes)]) of parameters one after another, reduced at once in a
        library's order as the library adds it, while APS shifts each parameter by its own exponent
        (it scales a tensor before the transport, as CPD does), not the buffer by one. ``groups``:
        ``(group of each flat element, each group's workers in adding order)``, an order the caller
        derived (FSDP's NCCL reduce-scatter: ``orders.nccl_reduce_scatter_groups``) instead of
        ``self.order``'s. ``shifts``: with ``aps``, the shift of each of ``sizes``' segments, taken by
        the caller (FSDP: one a parameter, over all its shards) instead of each segment's own."""
        n = stack.shape[0]
        if n < 1:
            raise ValueError(f"a reduction needs at least one worker (a stack [N, ...] with N >= 1), got a stack "
                             f"of shape {list(stack.shape)}")
        if sizes is not None and (stack.dim() != 2 or sum(sizes) != stack.shape[1]):
            raise ValueError(f"sizes {list(sizes)} do not cut a flat buffer of shape {list(stack.shape)}")
        with torch.autocast(stack.device.type, enabled=False):
            v = self._pre_divide(stack.float())
            cuts = sizes if sizes is not None else [v[0].numel()]
            if not self.aps or shifts is None:
                shifts = [aps_shift(part, self.fmt) if self.aps else 0 for part in _segments(v, cuts)]
            elif len(shifts) != len(cuts):
                raise ValueError(f"{len(shifts)} APS shifts for {len(cuts)} segments")
            v = _shift_segments(v, cuts, shifts)
            overflow.check("reduce", v, self.fmt)  # a loss scaler watching sees a worker's gradient overflow
            terms = self._q_workers(v)
            if groups is not None:
                total = self._sum(_by_groups(terms, *groups))
            else:
                total = self._tree_sum(terms) if self.order == "nccl-tree" else self._sum(self._ordered(terms))
            total = _shift_segments(total[None], cuts, [-x for x in shifts])[0]
            if self.average and self.divide == "after":
                total = total / n
        return total

    def _pre_divide(self, v: torch.Tensor, n: Optional[int] = None) -> torch.Tensor:
        """Step 1 of the module docstring: the mean's division before the sum (none for ``after``);
        ``n`` the workers (``v``'s rows by default)."""
        n = v.shape[0] if n is None else n
        if not self.average or self.divide == "after":
            return v
        if self.divide == "before":
            return v / n
        if self.divide == "cast-first":  # fp16_compress_hook: q(q(g) / N)
            return self._q_workers(v) / n
        inv = self._q(torch.tensor(1.0 / n, dtype=torch.float32, device=v.device))  # NCCL: q(float(1.0 / N))
        return self._q_workers(self._q_workers(v) * inv)

    def _ordered(self, terms: torch.Tensor) -> list[torch.Tensor]:
        """The N addends in the order they are added: step k holds, per element,
        the value of the k-th worker of that element's order."""
        n = terms.shape[0]
        if self.order == "sequential" or n <= 2:  # two addends: both orders add t0 + t1 (addition commutes)
            return list(terms.unbind(0))
        if self.order == "gloo":  # the flat buffer's chunks, each added from rank c-1 down to rank c
            flat = terms.reshape(n, -1)
            chunk = gloo_chunks(flat.shape[1], n, element_bytes(self.fmt)).to(flat.device)
            cols = torch.arange(flat.shape[1], device=flat.device)
            return [flat[(chunk - 1 - k) % n, cols].reshape(terms.shape[1:]) for k in range(n)]
        if self.order == "nccl-ring":  # per channel and block, chunk j from ring index j+1 round to j
            return _by_groups(terms, *nccl_ring_groups(terms[0].numel(), n, element_bytes(self.fmt), self.nccl))
        shape = tuple(terms.shape[1:])
        t = terms.reshape(n, *(shape or (1,)))
        owner = ring_owner(tuple(t.shape[1:]), n, self.fmt).to(t.device)
        rows = torch.arange(t.shape[1], device=t.device)
        out = []
        for k in range(n):
            pick = t[(owner + k) % n, rows]  # row r of worker (owner(r) + k) mod N
            out.append(pick.reshape(shape))
        return out

    def _tree_sum(self, terms: torch.Tensor) -> torch.Tensor:
        """NCCL's tree: each element summed along its channel's tree (``orders.nccl_tree``), every
        rank adding its own value, then its children's partial sums in order, each add rounded."""
        n = terms.shape[0]
        flat = terms.reshape(n, -1)

        def fold(node) -> torch.Tensor:
            rank, kids = node
            acc = flat[rank]
            for kid in kids:
                acc = self.q_sum(acc, fold(kid))
            return acc
        parts = channel_parts(flat.shape[1], self.nccl.channels, element_bytes(self.fmt))
        first = -(-self.nccl.channels // 2)  # channels 0 .. first-1 run tree 0, the rest tree 1
        sums = [fold(nccl_tree(n, self.nccl.nodes, t)) for t in ((0,) if len(parts) <= first else (0, 1))]
        out = sums[0].clone()
        for c, (off, count) in enumerate(parts):
            if c >= first:
                out[off:off + count] = sums[1][off:off + count]
        return out.reshape(terms.shape[1:])

    def q_sum(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``q(a + b)``: one rounded add of the reduction, its float32 sum first shown to a watching
        overflow flag (``bfp.overflow``), so a loss scaler skips a step whose reduced sums overflow or
        saturate the format, as it does for a layer's gradient points."""
        x = a + b
        overflow.check("reduce", x, self.fmt)
        return self._q(x)

    def _sum(self, terms: list[torch.Tensor]) -> torch.Tensor:
        s, comp = terms[0], None
        for t in terms[1:]:
            if self.kahan:
                comp = torch.zeros_like(s) if comp is None else comp
                y = self._q(t - comp)
                total = self.q_sum(s, y)
                comp = self._q(self._q(total - s) - y)
                s = total
            else:
                s = self.q_sum(s, t)
        return s

    def describe(self) -> str:
        fmt = "float32" if self.fmt is None else repr(self.fmt)
        if self.order.startswith("nccl"):
            o = self.nccl
            fmt += f", {o.channels} channel(s), {o.protocol}" + (f", {o.nodes} node(s)" if self.order == "nccl-tree" else "")
        extras = [x for x, on in (("APS", self.aps), ("Kahan", self.kahan)) if on]
        mean = f"mean (divide {self.divide})" if self.average else "sum"
        return f"gradient reduction: {fmt}, {self.order} order, {mean}" + "".join(f", {x}" for x in extras)
