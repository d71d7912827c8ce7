"""One rank of a multi-process test (launched by tests/test_distributed*.py with RANK/WORLD_SIZE set).

    python tests/_dist_worker.py hook OUT_DIR      DDP hook and emulated workers; saves OUT_DIR/rank<r>.pt
    python tests/_dist_worker.py ring OUT_DIR [E]  the ring on uneven shapes, E workers per process (default 1);
                                                   saves OUT_DIR/rank<r>.pt
    python tests/_dist_worker.py cifar ARGS_JSON   cifar.py runs (a JSON list of argument lists), in turn;
                                                   an item {"copy_run": [SRC, DST]} makes rank 0 copy a run
                                                   directory without its last.pt (to resume an earlier epoch);
                                                   {"task": NAME, "argv": [...]} runs another script (imagenet),
                                                   with "expect": STATUS a run that must end with that status;
                                                   {"edit_checkpoint": [SRC, DST, HOW]} makes rank 0 write SRC
                                                   edited (HOW: "drop_model_entry", "optimizer_shape") to DST;
                                                   {"record": DIR} makes every rank save DIR/rank<r>.pt after
                                                   the next run (``Recorder``: what rank 0's logs cannot show);
                                                   with "overflow_at": [RANK, STEP] that rank's loss is
                                                   multiplied by BIG at training step STEP (1-based), so its
                                                   simulated e5m2 gradients saturate (a local overflow)
"""
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bfp import amp as amp_mod  # noqa: E402
from bfp.amp import MixedPrecision  # noqa: E402
from bfp.distributed import env as dist_env  # noqa: E402
from bfp.distributed.ddp import DDPStep  # noqa: E402
from bfp.distributed.emulated import EmulatedStep  # noqa: E402
from bfp.distributed.reduce import RoundedReduce  # noqa: E402
from bfp.distributed.hook import RoundedHookState, rounded_allreduce_hook  # noqa: E402
from bfp.dynamic import DynamicPrecision  # noqa: E402
from bfp.formats import Float, format_from_name  # noqa: E402
from bfp.formats.mx import MX  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

# name -> RoundedReduce keyword arguments (the test builds the same reductions)
CONFIGS = {
    "e4m3_ring": dict(fmt="e4m3", order="ring"),
    "e4m3_sequential": dict(fmt="e4m3", order="sequential"),
    "e5m2_aps_kahan_after": dict(fmt="e5m2", order="ring", aps=True, kahan=True, divide="after"),
    "bf16_sum": dict(fmt="bfloat16", order="sequential", average=False),
    "mx_e4m3": dict(fmt=MX(format_from_name("e4m3"), block=4), order="ring"),
    "fb16": dict(fmt="fb16", order="ring"),
    "fp32": dict(fmt=Float(8, 23), order="ring"),
}


def reduction(cfg: dict) -> RoundedReduce:
    cfg = dict(cfg)
    fmt = cfg.pop("fmt")
    return RoundedReduce(format_from_name(fmt) if isinstance(fmt, str) else fmt, **cfg)


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))


def batch(rank: int, n: int = 4):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, 2, 6, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def local_grads(model, x, y, scale=1.0):
    model.zero_grad(set_to_none=True)
    (nn.functional.cross_entropy(model(x), y) * scale).backward()
    return [p.grad.clone() for p in model.parameters()]


def hook_case(rank: int, out: Path) -> None:
    x, y = batch(rank)
    result = {"local": {}, "hook": {}, "plain": None}
    for name, cfg in CONFIGS.items():
        model = tiny_model()
        index = {id(p): i for i, p in enumerate(model.parameters())}
        ddp = DistributedDataParallel(model)
        state = RoundedHookState(reduction(cfg))
        local = result["local"][name] = [None] * len(index)

        def recording_hook(state, bucket):  # the hook's input: this rank's bucket before the reduction
            for p, g in zip(bucket.parameters(), bucket.gradients()):
                local[index[id(p)]] = g.clone()
            return rounded_allreduce_hook(state, bucket)

        ddp.register_comm_hook(state, recording_hook)
        nn.functional.cross_entropy(ddp(x), y).backward()
        result["hook"][name] = [p.grad.clone() for p in model.parameters()]
    plain = [g.clone() for g in result["local"]["fp32"]]  # torch.distributed's float32 all-reduce
    for g in plain:
        dist.all_reduce(g)
        g.div_(dist.get_world_size())
    result["plain"] = plain

    # APS: a weight whose gradient is 1e-8 * [1, 2): below e4m3's and e5m2's smallest subnormal
    tiny = {}
    for fmt in ("e4m3", "e5m2"):
        for aps in (False, True):
            lin = nn.Linear(4, 2, bias=False)
            ddp = DDPStep(RoundedReduce(format_from_name(fmt), aps=aps)).prepare(lin)
            v = torch.tensor([[1.0, 1.25, 1.5, 1.75 + 0.125 * rank]])
            (ddp(v).sum() * 1e-8).backward()
            tiny[f"{fmt}_aps{aps}"] = lin.weight.grad.clone()
    result["tiny"] = tiny

    # 2 processes x 2 emulated workers = 4 workers, both orders
    xs, ys = batch(rank, 8)
    result["workers"] = [local_grads(tiny_model(), xw, yw) for xw, yw in zip(xs.chunk(2), ys.chunk(2))]
    result["emulated"], result["gathered"] = {}, {}
    for order in ("ring", "sequential"):
        model = tiny_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        step = EmulatedStep(2, RoundedReduce(format_from_name("e4m3"), order=order))
        step.keep_rows = True
        step(step.prepare(model), xs, ys, criterion=nn.CrossEntropyLoss(), optimizer=opt,
             amp=MixedPrecision("fp32"))  # no autocast, no scaling
        result["emulated"][order] = [p.grad.clone() for p in model.parameters()]
        # this rank's 2 workers' flat gradients as the step had them; the test joins the ranks'
        total = sum(p.numel() for p in model.parameters())
        result["gathered"][order] = step.last_rows[:, :total].clone()
    torch.save(result, out / f"rank{rank}.pt")


BIG = 1e6  # x 1024 (the tests' loss scale): gradients far above e5m2's 57344, finite in float32


class Recorder:
    """Per rank, every loss-scaler step (this rank's own overflow flag before the OR over ranks,
    whether it stepped, the scale and the parameters after it) and every dynamic precision
    decision's rows, from ``start(DIR)`` to ``save()`` (``DIR/rank<r>.pt``)."""

    def __init__(self, rank: int):
        self.rank, self.path = rank, None
        self.steps, self.decisions = [], []
        local = {}
        any_rank, scaler_step, decide = amp_mod._any_rank, amp_mod.LossScaler.step, DynamicPrecision.decide

        def recording_any_rank(found, grads):
            local["flag"] = None if found is None else bool(found.item())
            return any_rank(found, grads)

        def recording_step(scaler, optimizer, simulated_overflow=None):
            stepped = scaler_step(scaler, optimizer, simulated_overflow)
            self.steps.append({"local_overflow": local.pop("flag", None), "stepped": stepped, "scale": scaler.scale,
                               "params": [p.detach().clone() for g in optimizer.param_groups for p in g["params"]]})
            return stepped

        def recording_decide(dp, *args, **kwargs):
            rows = decide(dp, *args, **kwargs)
            self.decisions.append(rows)
            return rows

        amp_mod._any_rank, amp_mod.LossScaler.step = recording_any_rank, recording_step
        DynamicPrecision.decide = recording_decide

    def start(self, out: str, overflow_at=None) -> None:
        self.path, self.steps, self.decisions = Path(out) / f"rank{self.rank}.pt", [], []
        if overflow_at is not None and overflow_at[0] == self.rank:
            backward, count = MixedPrecision.backward, {"n": 0}

            def saturating_at(mp, loss):  # an overflow of this rank's micro-batch only, at one step
                count["n"] += 1
                return backward(mp, loss * BIG if count["n"] == overflow_at[1] else loss)
            MixedPrecision.backward = saturating_at

    def save(self) -> None:
        if self.path is not None:
            torch.save({"steps": self.steps, "decisions": self.decisions}, self.path)
        self.path = None


# The ring's cases: parameter shapes that split unevenly over 3 and 4 ranks, and reductions.
RING_SHAPES = [(5, 3, 3, 3), (7,), (13, 10), (), (3, 24), (33, 4, 1, 1)]
RING_CONFIGS = {
    "e4m3": dict(fmt="e4m3", order="ring"),
    "e5m2_aps_kahan_after": dict(fmt="e5m2", order="ring", aps=True, kahan=True, divide="after"),
    "bf16_sum": dict(fmt="bfloat16", order="ring", average=False),
    "fb12": dict(fmt="fb12", order="ring"),
    "fb16_aps": dict(fmt="fb16", order="ring", aps=True),
    "mx_e4m3_axis0": dict(fmt=MX(format_from_name("e4m3"), block=4, axis=0), order="ring"),
    "mx_e2m1_kahan": dict(fmt=MX(format_from_name("float4_e2m1fn"), block=8, axis=-1), order="ring", kahan=True),
    "float32": dict(fmt=None, order="ring"),
}


def ring_case(rank: int, out: Path, local_workers: int = 1) -> None:
    """Every rank's workers' gradients and what the ring made of them, per config: one worker
    per process through ``ring_allreduce`` (the DDP hook's), several through
    ``ring_reduce_workers`` (--emulate-node's)."""
    from bfp.distributed.ring import ring_allreduce, ring_reduce_workers
    g = torch.Generator().manual_seed(7 + rank)
    workers = []
    for w in range(local_workers):
        grads = [torch.randn(s, generator=g) * torch.exp2(torch.randint(-6, 6, s, generator=g).float())
                 for s in RING_SHAPES]
        grads[2][0, 0] = 3e-9 * (rank + w + 1)  # tiny values APS keeps
        workers.append(grads)
    shapes = [torch.Size(s) for s in RING_SHAPES]
    result = {"workers": workers, "ring": {}, "bytes": {}, "numel": sum(t.numel() for t in workers[0])}
    for name, cfg in RING_CONFIGS.items():
        rows = torch.stack([torch.cat([t.reshape(-1) for t in w]) for w in workers])
        if local_workers == 1:
            buf = rows[0].clone()
            result["bytes"][name] = ring_allreduce(reduction(cfg), buf, shapes)
        else:
            buf, result["bytes"][name] = ring_reduce_workers(reduction(cfg), rows, shapes)
        result["ring"][name] = buf
    torch.save(result, out / f"rank{rank}.pt")


def main() -> int:
    mode = sys.argv[1]
    e = dist_env.read_env()
    if mode in ("hook", "ring"):
        torch.set_num_threads(1)
        dist_env.init(e, torch.device("cpu"))
        if mode == "hook":
            hook_case(e.rank, Path(sys.argv[2]))
        else:
            ring_case(e.rank, Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
        dist.barrier()
        return 0
    from bfp.cli import run_task
    recorder = Recorder(e.rank)
    for argv in json.loads(sys.argv[2]):
        if isinstance(argv, dict) and "record" in argv:
            recorder.start(argv["record"], argv.get("overflow_at"))
            continue
        expect = 0
        if isinstance(argv, dict) and "task" in argv:
            task, argv, expect = argv["task"], argv["argv"], argv.get("expect", 0)
        elif isinstance(argv, dict) and "edit_checkpoint" in argv:
            if e.rank == 0:
                edit_checkpoint(*argv["edit_checkpoint"])
            dist.barrier()
            continue
        elif isinstance(argv, dict):
            src, dst = argv["copy_run"]
            if e.rank == 0:
                shutil.copytree(src, dst)
                (Path(dst) / "checkpoints" / "last.pt").unlink()
            dist.barrier()
            continue
        else:
            task = "cifar"
        status = run_task(task, argv)
        recorder.save()
        if status != expect:
            print(f"_dist_worker: the run ended with status {status}, expected {expect}", flush=True)
            return status or 1
    return 0


def edit_checkpoint(src: str, dst: str, how: str) -> None:
    """A checkpoint edited as a user might, written by the project's own writer (CRC and all)."""
    from bfp.engine import checkpoint
    state = checkpoint.load(src)
    if how == "drop_model_entry":
        del state["model"][next(iter(state["model"]))]
    elif how == "optimizer_shape":
        entry = next(iter(state["optimizer"]["state"].values()))
        entry["momentum_buffer"] = torch.zeros(5123)
    else:
        raise ValueError(how)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    checkpoint.save(state, dst)


if __name__ == "__main__":
    sys.exit(main())
