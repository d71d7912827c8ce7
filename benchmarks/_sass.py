"""A Triton launch compiled for sm_90 exactly as the JIT compiles it, and its SASS counted by pipe.

``captured()`` records the launches bfp's own launch functions make (``JITFunction.run`` is
replaced for the duration, so nothing runs and meta tensors serve as the data); ``compile_launch``
then binds each launch's arguments with Triton's own binder (``create_function_from_signature``,
the function a real launch binds with) and packs them with ``JITFunction._pack_args``: float32
pointers where a launch passes float32 tensors, the 16-byte alignment and divisible-by-16
specialisation a launch gives torch's allocations and integer arguments, and the launch's
constexprs and options (``num_warps``, ``enable_fp_fusion``). Only the target is set by hand:
``GPUTarget("cuda", 90, 32)``, compiled by triton's bundled ptxas, no GPU needed.

``count`` splits the SASS by pipe (sm_90, from the Nsight Compute pipe names; Hopper's SM has 4
schedulers each issuing one warp-instruction a clock, and per scheduler 16 INT32 lanes, 32 FP32
lanes split between the fmaheavy and fmalite pipes, 4 SFU lanes):

* ``alu``: integer and logic instructions other than IMAD/IMUL, integer and float compares,
  selects and min/max, shifts (LOP3, SEL, FSEL, ISETP, FSETP, SHF, VIMNMX, IADD3, VIADD, LEA ...):
  half the issue rate;
* ``imad``: IMAD and IMUL in every form (ptxas moves and adds with ``IMAD.MOV``/``IMAD.IADD``):
  the fmaheavy pipe only, half the issue rate;
* ``fp32``: FADD, FMUL, FFMA: either FMA pipe, full rate shared with ``imad``;
* ``xu``: MUFU and conversions (I2F, F2I, F2F, FRND): an eighth of the issue rate;
* ``lsu``: loads, stores, atomics, shuffles; ``ctrl``: branches, barriers, EXIT, NOP;
  ``uniform``: the uniform datapath (U*, S2UR, R2UR), once a warp.

Executed path: the code after the function's last ``EXIT`` reached by ``CALL`` (``div_rn``'s
slow path) is reported as ``slow``, not executed; a backward branch is a loop whose body counts
``trips`` times (the caller's number); forward conditional branches as ``count`` says (an
if/else counts its longer side, a range that only calls the slow path nothing, any other range
in full).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

TARGET = GPUTarget("cuda", 90, 32)
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

# H200 SXM: 132 SMs, 4 schedulers an SM, 1.98 GHz boost, 4.8 TB/s HBM3e (NVIDIA's H200 datasheet).
SMS, SCHEDULERS, CLOCK, BANDWIDTH = 132, 4, 1.98e9, 4.8e12
# what each pipe costs in issue slots per instruction (its lanes: 32 is full rate)
COST = {"alu": 2, "imad": 2, "fp32": 1, "xu": 8}


def issue_slots(bytes_per_element: float) -> float:
    """Thread-instructions an H200 issues per element in the time copy bandwidth moves one."""
    return SMS * SCHEDULERS * CLOCK * 32 * bytes_per_element / BANDWIDTH


@dataclasses.dataclass
class Launch:
    fn: JITFunction
    args: tuple
    kwargs: dict
    grid: tuple


@contextlib.contextmanager
def captured():
    """Record (not run) every Triton launch made inside: yields the list they are appended to."""
    calls: list[Launch] = []
    original = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        calls.append(Launch(self, args, dict(kwargs), tuple(grid)))

    JITFunction.run = record
    try:
        yield calls
    finally:
        JITFunction.run = original


_STAND_INS: dict = {}


def _stand_in(a):
    """A CPU tensor of ``a``'s dtype (torch aligns its allocations to 64 bytes, the caching
    allocator on a GPU to 512): the binder reads only the dtype and the pointer's alignment."""
    if isinstance(a, torch.Tensor):
        return _STAND_INS.setdefault(a.dtype, torch.empty(16, dtype=a.dtype))
    return a


def compile_launch(launch: Launch):
    """The kernel ``launch`` runs, compiled for sm_90 as ``JITFunction.run`` would compile it."""
    fn = launch.fn
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = {k: _stand_in(v) for k, v in launch.kwargs.items()}
    kwargs.update(debug=kwargs.get("debug", fn.debug) or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, spec, opts = binder(*map(_stand_in, launch.args), **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)


_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);")


def disassemble(cubin: bytes) -> list[tuple[int, str, str, str]]:
    """(address, predicate, opcode, operands) of every SASS instruction in ``cubin``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out.append((int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return out


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers a thread, spill bytes) of ``cubin`` (``cuobjdump -res-usage``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                              text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", text).group(1))
    return regs, sum(int(v) for v in re.findall(r"(?:STACK|LOCAL):(\d+)", text))


_ALU = ("LOP", "LOP3", "SEL", "FSEL", "ISETP", "FSETP", "DSETP", "SHF", "SHL", "SHR", "IMNMX", "VIMNMX", "FMNMX",
        "IADD3", "IADD", "VIADD", "VIADDMNMX", "LEA", "IABS", "POPC", "FLO", "BREV", "PRMT", "SGXT", "BMSK",
        "PLOP3", "P2R", "R2P", "MOV", "CS2R", "FCHK", "ICMP", "I2IP", "F2FP", "HMNMX2", "VABSDIFF", "PSETP")
_XU = ("MUFU", "I2F", "F2I", "F2F", "FRND", "I2FP", "F2IP")
_LSU = ("LDG", "STG", "LDS", "STS", "LDC", "LD", "ST", "ATOM", "ATOMG", "ATOMS", "RED", "REDG", "SHFL", "LDL",
        "STL", "LDSM", "MEMBAR", "MATCH", "VOTE")
_CTRL = ("BRA", "EXIT", "BAR", "NOP", "CALL", "RET", "BSSY", "BSYNC", "WARPSYNC", "YIELD", "DEPBAR", "S2R",
         "BREAK", "JMP", "BPT", "ERRBAR", "CCTL")


def pipe(opcode: str) -> str:
    """The pipe an sm_90 instruction issues to (module docstring)."""
    base = opcode.split(".")[0]
    if base.startswith("U") or base in ("S2UR", "R2UR", "ULDC"):
        return "uniform"
    if base in ("IMAD", "IMUL", "IDP", "IMADSP"):
        return "imad"
    if base in ("FADD", "FMUL", "FFMA", "FMUL32I", "FADD32I", "FFMA32I"):
        return "fp32"
    if base in ("DADD", "DMUL", "DFMA"):
        return "fp64"
    for name, ops in (("alu", _ALU), ("xu", _XU), ("lsu", _LSU), ("ctrl", _CTRL)):
        if base in ops:
            return name
    return "other"


PIPES = ("alu", "imad", "fp32", "xu", "lsu", "ctrl", "uniform", "fp64", "other")


def _target(operands: str) -> int | None:
    m = re.search(r"0x([0-9a-f]+)", operands)
    return int(m.group(1), 16) if m else None


def count(sass: list, trips: int = 1) -> dict:
    """Executed instructions by pipe of one thread (module docstring): ``trips`` the iterations of
    every loop. Forward conditional branches: an if/else (the branch lands just past an
    unconditional forward ``BRA`` that skips the other side) counts its longer side, the shorter
    being the exceptional case (NVFP4's all-zero tensor); a one-sided range that only calls a
    subroutine (``div_rn``'s slow path) counts nothing; any other one-sided range counts in full
    (an upper bound). ``cond``: the instructions so left out or in doubt."""
    last_exit = max((a for a, _, op, _ in sass if op == "EXIT"), default=0)
    addrs = [a for a, _, _, _ in sass]
    ops = {a: op for a, _, op, _ in sass}
    weight = {a: 1 for a in addrs}
    slow = cond = 0
    for a, pred, op, operands in sass:
        if a > last_exit:  # subroutines (CALL targets) and padding after the last EXIT
            weight[a] = 0
            slow += op not in ("NOP", "BRA")

    def span(lo, hi):
        return [b for b in addrs if lo <= b < hi]
    for a, pred, op, operands in sass:
        if op.split(".")[0] != "BRA" or a > last_exit:
            continue
        t = _target(operands)
        if t is None:
            continue
        if t <= a:  # a loop: its body runs ``trips`` times
            for b in span(t, a + 1):
                weight[b] *= trips
            continue
        if not pred:
            continue
        then = span(a + 1, t)
        jump = then[-1] if then else None
        end = _target(next(o for b, _, _, o in sass if b == jump)) if jump and ops[jump] == "BRA" else None
        if end is not None and end > t and not next(p for b, p, _, _ in sass if b == jump):  # if/else
            other = span(t, end)
            short = then if len(then) < len(other) else other
            cond += len(short)
            for b in short:
                weight[b] = 0
        elif any(ops[b].startswith("CALL") for b in then):  # a call to a slow path
            cond += len(then)
            for b in then:
                weight[b] = 0
        else:
            cond += len(then)
    by_pipe = dict.fromkeys(PIPES, 0)
    for a, _, op, _ in sass:
        by_pipe[pipe(op)] += weight[a]
    return {"all": sum(by_pipe.values()), **by_pipe, "slow": slow, "cond": cond, "static": len(sass)}


def pressure(per_element: dict, bytes_per_element: float) -> dict:
    """Issue slots each pipe needs per element, the budget at ``bytes_per_element`` of traffic, and
    the estimated fraction of copy speed (the budget over the busiest pipe, at most 1)."""
    fma = max(COST["imad"] * per_element["imad"], per_element["imad"] + per_element["fp32"])
    need = {"issue": per_element["all"], "alu": COST["alu"] * per_element["alu"],
            "fma": fma, "xu": COST["xu"] * per_element["xu"]}
    budget = issue_slots(bytes_per_element)
    busiest = max(need, key=need.get)
    return {"budget": round(budget, 1), "busiest": busiest, "x_copy": round(min(1.0, budget / max(need[busiest], 1e-9)), 2)}
