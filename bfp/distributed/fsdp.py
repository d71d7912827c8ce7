"""The rounded gradient reduce-scatter of FSDP2 (``torch.distributed.fsdp.fully_shard``).

``install_rounded_reduce_scatter(model, reduce)`` gives every FSDP module of ``model`` (the setting is
not recursive) a ``RoundedReduceScatter``: FSDP hands it this rank's whole gradient of the module's
parameters as one flat buffer of ``W`` rows, row ``r`` holding the dim-0-padded shard ``r`` of every
parameter (FSDP's ``foreach_reduce``), and takes back row ``rank`` reduced, by ``RoundedReduce``.
**Transport**: by default an all-to-all (each rank receives every rank's row ``rank``, what a ring
moves, and reduces that shard in the order its elements take in the whole buffer) wherever the order
adds element by element at known positions (``gloo``, ``nccl-ring``, ``sequential`` with an
element-wise format); an all-gather of the whole buffers (``W`` times a ring's traffic) where the
order needs a parameter or the buffer whole (``param-ring``, block formats, ``nccl-tree``). The two
give the same bits (tested). **APS** takes one shift a parameter, over all its shards and workers
(CPD's per-tensor scale; with the all-to-all each rank's per-parameter maxima are all-reduced with
MAX, the one small collective APS adds). The orders:

* ``gloo`` (and ``nccl-tree``): on FSDP's flat buffer as it is, in the all-reduce's order, which
  is what gloo's ``reduce_scatter`` does (its ring all-reduce of the whole buffer, then chunk
  ``rank`` kept).
* ``nccl-ring``: NCCL's ring reduce-scatter (``src/device/reduce_scatter.h``, ``runRing``;
  ``orders.nccl_reduce_scatter_groups``): rank ``d``'s segment is started by the rank after ``d`` on
  each channel's ring and finished by ``d``, channels cutting each segment as they cut an
  all-reduce's buffer. Not compared with a real NCCL here (no GPU): tested against hand-derived sums.
* ``sequential`` and ``param-ring``: parameter by parameter in its (dim-0 padded) shape, so
  ``BlockFloat`` tiles and ``MX`` blocks are the parameter's own; FSDP's padding rows are zeros and
  round to zero (a tile that spans dim 0 sees them as zeros, the only rule where the cut meets a tile).

**Division.** ``mode="simulate"`` (the default) owns the division: FSDP's own is switched off
(``set_gradient_divide_factor(1.0)``, ``set_force_sum_reduction_for_comms(True)``) and the reduction
averages as ``reduce`` says (``average``, ``divide``), as the DDP hook does. ``mode="replay"`` leaves
FSDP's division as it is (its pre- and post-divide factors around a summing comm): with ``reduce`` a
summing float16 reduction in the ``gloo`` order it reproduces FSDP's real
``MixedPrecisionPolicy(reduce_dtype=torch.float16)`` reduce-scatter on gloo bit for bit (tested at W
= 3 and 4). The reduced values are written in the buffer's dtype.

**The rounded weight all-gather.** ``install_rounded_all_gather(model, fmt)`` sets a
``RoundedAllGather`` on every FSDP module: each rank rounds its shards of the parameters (FSDP's
all-gather input, in ``param_dtype``: float32, or bfloat16 under a ``MixedPrecisionPolicy``, which then
models TorchTitan's double rounding, the cast to bfloat16 and then the format) to ``fmt`` before they
are sent, and the layers compute on the values communicated; the sharded FP32 master is not touched
(the optimizer updates it). FSDP's buffer is flat, so only element-wise formats are taken (a block
format's tiles would need each parameter's shape; refused with that reason). Tested: training equals
one process that rounds the master before every forward.

The layout is read from FSDP's parameter group (``FSDPParam.padded_sharded_param_size``, its
``fsdp_placement``), private torch attributes checked when the comm is installed.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from ..formats import Format, Rounding
from ..kernels import needs_keys, quantize
from .hook import gather_workers
from .orders import element_bytes, gloo_chunks, gloo_order, nccl_reduce_scatter_groups
from .reduce import LIBRARY_ORDERS, RoundedReduce, aps_shift_of

__all__ = ["RoundedReduceScatter", "install_rounded_reduce_scatter", "TRANSPORTS", "RoundedAllGather", "install_rounded_all_gather",
           "MODES", "FSDPStep", "shard_units"]

MODES = ("simulate", "replay")


TRANSPORTS = ("auto", "all-gather", "all-to-all")


class RoundedReduceScatter:
    """FSDP2's ``ReduceScatter`` comm (``torch.distributed.fsdp``) through ``RoundedReduce`` (module
    docstring); ``shapes``: the padded unsharded shape of each parameter of the FSDP module, in FSDP's
    order; ``transport``: ``all-to-all`` (each rank receives every rank's copy of its own shard and
    reduces it: what a ring moves), ``all-gather`` (every rank receives every rank's whole buffer), or
    ``auto``: all-to-all wherever the order adds element by element at known positions (``gloo``,
    ``nccl-ring``, and ``sequential`` with an element-wise format), all-gather otherwise (``param-ring``
    and block formats need each parameter's whole shape; ``nccl-tree`` the whole buffer's channels)."""

    def __init__(self, reduce: RoundedReduce, shapes: list[torch.Size], transport: str = "auto"):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: allowed {', '.join(TRANSPORTS)}")
        self.reduce, self.shapes = reduce, [torch.Size(s) for s in shapes]
        sliceable = reduce.order in ("gloo", "nccl-ring") or (
            reduce.order == "sequential" and (reduce.fmt is None or reduce.fmt.elementwise))
        self.stochastic = reduce.fmt is not None and reduce.fmt.rounding is Rounding.STOCHASTIC
        if self.stochastic and (not sliceable or transport == "all-gather"):
            raise ValueError(f"stochastic rounding ({reduce.fmt!r}) needs each shard reduced by one rank, the "
                             f"all-to-all transport, which the {reduce.order} order with this format "
                             f"{'allows: leave transport auto' if sliceable else 'does not allow'}")
        if transport == "all-to-all" and not sliceable:
            raise ValueError(f"the {reduce.order} order with {reduce.fmt!r} needs every parameter whole (its blocks "
                             f"or chunks span shards): use the all-gather transport")
        self.transport = transport if transport != "auto" else "all-to-all" if sliceable else "all-gather"
        self.calls, self._orders = 0, {}

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op=None,
                 async_op: bool = False):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        n = output_tensor.numel()
        if input_tensor.numel() != world * n or sum(s.numel() for s in self.shapes) != world * n:
            raise RuntimeError(f"FSDP's reduce-scatter buffer holds {input_tensor.numel()} elements for {world} ranks "
                               f"of {n}; the parameters' padded sizes add to {sum(s.numel() for s in self.shapes)}")
        flat = input_tensor.reshape(1, -1).float()
        if self.transport == "all-to-all":
            output_tensor.copy_(self._own_shard(flat, world, rank, group))
        else:
            stack = gather_workers(flat, group)  # [W workers, W * n]
            output_tensor.copy_(self._reduce(stack, world)[rank * n:(rank + 1) * n])
        self.calls += 1
        return None

    def _sizes(self, world: int) -> list[int]:
        return [s.numel() // world for s in self.shapes]  # one shard segment of each parameter a row

    def _shifts(self, v: torch.Tensor, world: int, group=None) -> Optional[list[int]]:
        """APS: one shift a parameter over all its shards and workers (CPD's per-tensor scale: the
        largest magnitude of the whole parameter's gradient, after the mean's pre-division), from
        ``v`` ([rows, W * n]: the workers' buffers, or this rank's alone with ``group``, whose
        maxima are then all-reduced with MAX, the one small collective APS adds)."""
        if not self.reduce.aps:
            return None
        sizes = self._sizes(world)
        rows = self.reduce._pre_divide(v, world).reshape(v.shape[0], world, -1)
        bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
        amax = torch.stack([rows[:, :, a:b].abs().amax() if b > a else rows.new_zeros(())
                            for a, b in zip(bounds, bounds[1:])])
        if group is not None:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
        return [aps_shift_of(a, world, self.reduce.fmt) for a in amax.double().tolist()]

    def _own_shard(self, flat: torch.Tensor, world: int, rank: int, group) -> torch.Tensor:
        """The all-to-all transport: every rank's copy of this rank's shard ([W, n]) received and
        reduced in the order the elements of that shard take in the whole buffer."""
        send = flat.reshape(world, -1).contiguous()  # row r: this rank's gradient of rank r's shard
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)  # row w: rank w's gradient of this rank's shard
        groups = self._shard_order(world, rank, send.shape[1])
        reduce = self.reduce
        if self.stochastic:  # this rank alone rounds this shard: draws of its own, reproducible from the seed
            reduce = dataclasses.replace(reduce, generator=_rank_draws(rank, flat.device))
        return reduce(recv, self._sizes(world), groups=groups, shifts=self._shifts(flat, world, group))

    def _shard_order(self, world: int, rank: int, n: int):
        """``RoundedReduce``'s ``groups`` for this rank's shard of ``n`` elements: the order each
        element takes in the whole buffer (None for rank order). Fixed for a module: derived once."""
        key = (world, rank, n)
        if key not in self._orders:
            es, mine = element_bytes(self.reduce.fmt), slice(rank * n, (rank + 1) * n)
            if self.reduce.order == "gloo":
                groups = (gloo_chunks(world * n, world, es)[mine], [gloo_order(c, world) for c in range(world)])
            elif self.reduce.order == "nccl-ring":
                g, orders = nccl_reduce_scatter_groups(n, world, es, self.reduce.nccl)
                groups = (g[mine], orders)
            else:  # sequential: rank order, wherever the element is
                groups = None
            self._orders[key] = groups
        return self._orders[key]

    def _reduce(self, stack: torch.Tensor, world: int) -> torch.Tensor:
        """Every worker's flat buffer ([W, W * n]) reduced, in FSDP's flat layout (all-gather transport)."""
        sizes = self._sizes(world)
        if self.reduce.order in LIBRARY_ORDERS:  # the flat buffer as the library adds it, APS a parameter
            shifts = self._shifts(stack, world)
            row_shifts = None if shifts is None else shifts * world  # the buffer's segments: W rows of them
            groups = None
            if self.reduce.order == "nccl-ring":  # NCCL's ring reduce-scatter: segment d from rank d+1 round to d
                groups = nccl_reduce_scatter_groups(stack.shape[1] // world, world, element_bytes(self.reduce.fmt),
                                                    self.reduce.nccl)
            return self.reduce(stack, sizes * world, shifts=row_shifts, groups=groups)
        rows = stack.reshape(stack.shape[0], world, -1)  # [worker, row, n]
        out = torch.empty(world, rows.shape[-1], dtype=torch.float32, device=stack.device)
        off = 0
        for shape, k in zip(self.shapes, sizes):  # each parameter whole: APS over it as RoundedReduce takes it
            full = rows[:, :, off:off + k].reshape(stack.shape[0], *shape)  # each worker's padded gradient
            out[:, off:off + k] = self.reduce(full).reshape(world, k)
            off += k
        return out.reshape(-1)


def _rank_draws(rank: int, device: torch.device) -> torch.Generator:
    """A generator for one reduce-scatter's stochastic roundings on ``rank``: seeded from one draw of
    torch's default CPU generator (each rank draws once a call, so the ranks' generators stay in
    step) mixed with the rank, so no two ranks round their shards with the same bits."""
    base = int(torch.randint(0, 2 ** 62, (1,)).item())
    return torch.Generator(device=device).manual_seed((base * 0x9E3779B1 + rank) % 2 ** 63)


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _padded_shapes(module: nn.Module, world: int) -> list[torch.Size]:
    groups = module._get_fsdp_state()._fsdp_param_groups
    if not groups:  # every parameter is in a sharded child: this module communicates nothing
        return []
    if len(groups) != 1:
        raise ValueError(f"{type(module).__name__}: {len(groups)} FSDP parameter groups; the rounded reduce-scatter "
                         f"takes one (no shard_placement_fn meshes)")
    shapes = []
    for p in groups[0].fsdp_params:
        if p.fsdp_placement.dim != 0:
            raise ValueError(f"{type(module).__name__}: a parameter sharded on dim {p.fsdp_placement.dim}; the rounded "
                             f"reduce-scatter models FSDP's default dim-0 sharding")
        s = p.padded_sharded_param_size
        shapes.append(torch.Size((s[0] * world, *s[1:])))
    return shapes


def install_rounded_reduce_scatter(model: nn.Module, reduce: RoundedReduce, mode: str = "simulate",
                                   group: Optional[dist.ProcessGroup] = None, transport: str = "auto"
                                   ) -> list[RoundedReduceScatter]:
    """A ``RoundedReduceScatter`` (``transport``: see the class) on every FSDP module of ``model``
    (``fully_shard`` applied first); returns them (their ``calls`` count the reductions run)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: allowed {', '.join(MODES)}")
    modules = _fsdp_modules(model)
    if not modules:
        raise ValueError("install_rounded_reduce_scatter needs a model fully_shard has sharded; none of its "
                         "modules is an FSDP module (apply fully_shard first)")
    world = dist.get_world_size(group)
    comms = []
    for m in modules:
        shapes = _padded_shapes(m, world)
        if not shapes:
            continue
        comm = RoundedReduceScatter(reduce, shapes, transport)
        if mode == "simulate":  # the comm divides as ``reduce`` says; FSDP's own division off
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
        m.set_custom_reduce_scatter(comm)
        comms.append(comm)
    return comms


class RoundedAllGather:
    """FSDP2's ``AllGather`` comm: this rank's shards rounded to ``fmt``, then gathered (module docstring)."""

    def __init__(self, fmt):
        self.fmt, self.calls = fmt, 0

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, async_op: bool = False):
        self.calls += 1
        return dist.all_gather_into_tensor(output_tensor, quantize(input_tensor, self.fmt), group=group,
                                           async_op=async_op)


def install_rounded_all_gather(model: nn.Module, fmt) -> list[RoundedAllGather]:
    """A ``RoundedAllGather`` of ``fmt`` (an element-wise format) on every FSDP module of ``model``."""
    if not isinstance(fmt, Format) or not fmt.elementwise or needs_keys(fmt) or fmt.history_length:
        raise ValueError(f"the rounded all-gather takes an element-wise format with deterministic rounding (FSDP "
                         f"gathers one flat buffer of every parameter's shard: a block format's tiles would need each "
                         f"parameter's shape, stochastic draws the whole tensor's indices), got {fmt!r}")
    modules = _fsdp_modules(model)
    if not modules:
        raise ValueError("install_rounded_all_gather needs a model fully_shard has sharded (apply fully_shard first)")
    comms = []
    for m in modules:
        if not m._get_fsdp_state()._fsdp_param_groups:
            continue
        comm = RoundedAllGather(fmt)
        m.set_custom_all_gather(comm)
        comms.append(comm)
    return comms


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules ``FSDPStep`` shards one by one before the root: every direct child of the root that
    holds parameters, a ``Sequential``'s or ``ModuleList``'s members one by one (a GPT's blocks, a
    ResNet's stages); the root then holds what is left (embeddings, a head)."""
    units = []
    for child in model.children():
        members = list(child.children()) if isinstance(child, (nn.Sequential, nn.ModuleList)) else [child]
        units += [m for m in members if any(True for _ in m.parameters())]
    return units


class FSDPStep:
    """``--fsdp``: one worker a process, the model sharded by FSDP2 (``shard``, called once before the
    optimizer is made: ``fully_shard`` replaces the parameters by sharded ones), the gradients
    reduce-scattered (rounded by ``reduce`` when given, FSDP's float32 mean otherwise) and the weights
    all-gathered (rounded to ``param_fmt`` when given). The step itself is the plain one."""

    n = 1

    def __init__(self, reduce: Optional[RoundedReduce] = None, param_fmt=None):
        self.reduce, self.param_fmt = reduce, param_fmt
        self.comms: list = []

    def shard(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard
        for unit in shard_units(model):
            fully_shard(unit)
        fully_shard(model)
        if self.reduce is not None:
            self.comms += install_rounded_reduce_scatter(model, self.reduce)
        if self.param_fmt is not None:
            self.comms += install_rounded_all_gather(model, self.param_fmt)
        return model

    def prepare(self, model: nn.Module) -> nn.Module:
        return model

    @staticmethod
    def full_state(model: nn.Module, optimizer) -> tuple[dict, dict]:
        """The model's and optimizer's whole (unsharded) state on rank 0, in CPU memory, through
        ``torch.distributed.checkpoint``'s state-dict API (a collective: every rank calls it; the
        other ranks get empty dicts). The optimizer's state is keyed by parameter names, so it
        loads into any sharding of the same model."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    @staticmethod
    def load_full_state(model: nn.Module, optimizer, model_state: dict, optimizer_state: dict) -> None:
        """``full_state``'s dicts (every rank holds them, read from the checkpoint) into a sharded
        model and its optimizer: each rank keeps its own shards."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state,
                       options=StateDictOptions(full_state_dict=True))

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, criterion, optimizer, amp):
        return amp.train_step(model, x, y, criterion=criterion, optimizer=optimizer)
