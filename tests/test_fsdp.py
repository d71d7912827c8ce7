"""Converted models under PyTorch's FSDP2 (``fully_shard``) on real gloo processes (issue 55, item 1).

FSDP2 frees its all-gathered parameters after each forward by resizing their storage to 0; the CPU
kernels once took ``weight.numpy()``, which locks a storage's size, and the first reshard failed.
Now a converted GPT (attention included) trains under ``fully_shard`` bit for bit as the one-process
data-parallel reference, for a BFP, an FP8, an MX and an NVFP4 preset."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_distributed import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import _fsdp_worker as W  # noqa: E402


def _env(world):
    """One intra-op thread for torch and Numba alike, in the ranks and the reference: with two, the
    reference's reductions (a LayerNorm's bias gradient) differ in the last bits."""
    return dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
                OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def _launch(args, out, world=2, ranks=True, timeout=240):
    """``_fsdp_worker.py ARGS`` as ``world`` gloo ranks (or, ``ranks=False``, one process with the same
    threads: a reference); its saved file, loaded."""
    env, n = _env(world), world if ranks else 1
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "_fsdp_worker.py"), *map(str, args)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(n)]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-3000:]
    return torch.load(out, weights_only=False) if out is not None else outs[0]


def _reference(preset, tmp_path, world=2):
    out = tmp_path / f"reference-{preset}.pt"
    return _launch(["--reference", preset, out, world], out, world, ranks=False)


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    return _reference("fp32", tmp_path_factory.mktemp("fp32"))


@pytest.mark.parametrize("preset", ["any_FB16", "any_fp8_e4m3", "any_mxfp8", "any_nvfp4"])
def test_a_converted_gpt_trains_under_fully_shard_as_the_one_process_reference(preset, tmp_path, fp32):
    got = _launch([preset, tmp_path / "fsdp.pt"], tmp_path / "fsdp.pt")["params"]
    want = _reference(preset, tmp_path)
    start = {k: v for k, v in W.model(preset).named_parameters()}
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert sum(not torch.equal(want[k], start[k]) for k in want) == len(want)  # every parameter trained
    # the preset rounds: the result is not FP32's
    assert not all(torch.equal(want[k], fp32[k]) for k in want)


@pytest.mark.parametrize("world, preset", [(3, "any_FB16"), (4, "any_nvfp4")])
def test_a_converted_gpt_trains_under_fully_shard_at_three_and_four_ranks_as_the_reference(world, preset, tmp_path):
    """W = 3 and 4: a sum of three or four float32 gradients depends on its order, so the reduction is
    fixed on both sides: the comm in float32 adding in rank order (FSDP's division off) and the
    one-process reference stacking the workers' gradients through the same ``RoundedReduce``. What is
    left to differ is what FSDP does to a converted model: shards padded on dim 0 to a multiple of W,
    all-gathered weights in buffers FSDP frees after each use, the layers' kernels on them."""
    got = _run_rs(world, "simulate", "sequential", "float32", tmp_path / "sim.pt", preset)
    ref = tmp_path / "ref.pt"
    want = _launch(["--rs-reference", "sequential", "float32", ref, world, preset], ref, world, ranks=False)
    start = dict(W.model(preset).named_parameters())
    assert got["calls"] == 9 and _same(got["params"], want)
    assert all(not torch.equal(want[k], start[k]) for k in want)  # every parameter trained
    plain = _launch(["--rs-reference", "sequential", "float32", ref, world], ref, world, ranks=False)
    assert not _same(want, plain)  # the preset rounds: not the FP32 model's result


def test_kernels_leave_a_storage_resizable():
    import bfp
    w = torch.randn(16, 32)
    for name in ("fb16", "float8_e4m3fn", "mxfp8_e4m3", "nvfp4"):
        bfp.quantize(w, bfp.format_from_name(name), backend="cpu")
    w.untyped_storage().resize_(0)  # what FSDP2's reshard does to an all-gathered parameter
    assert w.untyped_storage().nbytes() == 0
    from bfp.kernels.arrays import as_numpy  # the view the kernels take: writable, strided, any dtype
    x = torch.randn(4, 6)
    a = as_numpy(x.view(torch.int32))
    a[0, 0] = 0
    assert x[0, 0].item() == 0.0 and as_numpy(x[:, 1:3]).strides == (24, 4)
    assert (as_numpy(torch.nn.Parameter(x))[:, 1:3] == x[:, 1:3].numpy()).all()


@pytest.mark.parametrize("preset", ["any_fp8_e4m3", {"version": 1, "default": "fb16"}])
def test_converting_a_sharded_model_is_refused_saying_to_convert_first(preset):
    import json
    cfg = preset if isinstance(preset, str) else json.dumps(preset)
    out = _launch(["--convert-sharded", cfg], None, world=1)
    assert "refused: convert cannot convert a model fully_shard has already sharded ((model), blocks.0" in out
    assert "convert first, then shard" in out


# One process runs the presets in turn: an element-wise format first, whose decision to keep a shard
# must not be reused for the block and scaled formats after it on tensors of the same shapes.
TP_PRESETS = ["any_fp8_e4m3", "any_FB16", "any_mxfp8", "any_nvfp4", "any_fp8_tensorwise", "any_nvfp4_recipe",
              "any_fp8_delayed", "any_fp8_h100"]


@pytest.fixture(scope="module")
def tensor_parallel_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp") / "tp.pt"
    return _launch(["--tp", ",".join(TP_PRESETS), out], out, timeout=480)


@pytest.mark.parametrize("preset", TP_PRESETS)
def test_tensor_parallel_layers_round_as_the_whole_tensor(preset, tensor_parallel_runs):
    """Column- then row-parallel GEMMs of a converted MLP, one preset of each family (stochastic,
    delayed, Hadamard and fused-accumulator ones included), all in one process after one another.
    Block, scaled, stochastic and delayed roundings, the Hadamard transform and the fused GEMM are
    computed on the whole tensor (their rules redistribute to ``Replicate``): output and gradients
    equal the unparallelized model's bit for bit. A deterministic element-wise format keeps the
    row-parallel shard, whose partial GEMMs are summed across ranks as tensor parallelism always does:
    equal within float32's last bits there, exactly elsewhere."""
    d = tensor_parallel_runs[preset]
    exact = preset != "any_fp8_e4m3"
    assert torch.equal(d["got"], d["want"]) if exact else torch.allclose(d["got"], d["want"], rtol=1e-5, atol=1e-6)
    for n, g in d["grads"].items():
        if exact or n.startswith(("0.", "1.")):  # before the row-parallel sum: every bit
            assert torch.equal(g, d["ref_grads"][n]), n
        else:
            assert torch.allclose(g, d["ref_grads"][n], rtol=1e-5, atol=1e-6), n


def test_zero_setting_error_of_a_sharded_tensor_counts_every_shard(tensor_parallel_runs):
    """A DTensor's counts are its shards' summed: the share equals the whole tensor's."""
    for name, (got, want) in tensor_parallel_runs["zero_setting"].items():
        assert got == want and want > 0, name


def test_the_rules_shard_only_where_a_shard_rounds_as_the_whole():
    from bfp.formats import Scaled, format_from_name
    from bfp.kernels.sharding import shardable_dims
    f = format_from_name
    assert shardable_dims(f("e4m3"), (4, 8)) == [0, 1]  # element-wise: anywhere
    assert shardable_dims(f("fb16"), (64, 32, 3, 3)) == [0]  # BFP tiles span channels and the kernel
    assert shardable_dims(f("mxfp8_e4m3"), (64, 96)) == [0]  # MX blocks of 32 along the last axis
    assert shardable_dims(f("nvfp4"), (64, 96)) == []  # a per-tensor scale
    assert shardable_dims(Scaled(f("e4m3")), (64, 96)) == []
    assert shardable_dims(f("e4m3").with_rounding("stochastic"), (4, 8)) == []  # draws hash whole-tensor indices


def _run_rs(world, kind, order, fmt, out, preset="fp32", transport="auto"):
    """``_fsdp_worker.py --rs``: FSDP2 training of the GPT (``preset``: FP32 by default) with a
    reduce-scatter of ``kind``."""
    return _launch(["--rs", kind, order, fmt, out, preset, transport], out, world)


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("world", [3, 4])
def test_the_comm_replays_torchs_real_float16_reduce_scatter_bit_for_bit(world, tmp_path):
    """Issue 55, item 4: FSDP2 with MixedPrecisionPolicy(reduce_dtype=float16) on gloo, against the same
    policy with the rounded comm in replay mode (IEEE float16 sums in gloo's order, FSDP's own
    division around it): the same weights after three steps. At W = 3 the control, the comm adding in
    rank order instead, differs: the order is what makes the match."""
    real = _run_rs(world, "real16", "gloo", "ieee-fp16", tmp_path / "real.pt")
    replay = _run_rs(world, "replay16", "gloo", "ieee-fp16", tmp_path / "replay.pt")
    assert replay["calls"] == 3 * 3 and _same(real["params"], replay["params"])  # 3 FSDP modules x 3 steps
    if world == 3:
        control = _run_rs(world, "replay16", "sequential", "ieee-fp16", tmp_path / "control.pt")
        assert not _same(real["params"], control["params"])


@pytest.mark.parametrize("world, fmt", [(3, "e4m3"), (2, "fb16")])
def test_the_rounded_reduce_scatter_equals_rounded_reduce_on_the_stacked_worker_gradients(world, fmt, tmp_path,
                                                                                         fp32):
    """Issue 55, item 2: the comm averaging in ``fmt`` (sequential order, FSDP's division off) trains as
    one process that stacks every worker's gradient and reduces it with RoundedReduce; the rounding
    shows (the weights are not FP32 data parallelism's)."""
    got = _run_rs(world, "simulate", "sequential", fmt, tmp_path / "sim.pt")
    ref = tmp_path / "ref.pt"
    want = _launch(["--rs-reference", "sequential", fmt, ref, world], ref, world, ranks=False)
    assert got["calls"] == 9 and _same(got["params"], want)
    if world == 2:
        assert not _same(got["params"], fp32)


@pytest.mark.parametrize("world, order, fmt", [(3, "gloo", "e4m3+aps"), (4, "nccl-ring", "e5m2+aps+kahan"),
                                              (3, "sequential", "e4m3+aps")])
def test_the_all_to_all_transport_reduces_as_the_all_gather_does(world, order, fmt, tmp_path):
    """Issue 55, item 2: each rank receiving only every rank's copy of its own shard (all-to-all, what a
    ring moves; APS's per-parameter maxima by one MAX all-reduce) trains exactly as every rank
    receiving every whole buffer; APS and the order change the result (the comms ran)."""
    a2a = _run_rs(world, "simulate", order, fmt, tmp_path / "a2a.pt", "fp32", "all-to-all")
    ag = _run_rs(world, "simulate", order, fmt, tmp_path / "ag.pt", "fp32", "all-gather")
    assert a2a["calls"] == ag["calls"] == 9 and _same(a2a["params"], ag["params"])
    if order == "gloo":  # once is enough to show the comm's options reach the result
        plain = _run_rs(world, "simulate", order, fmt.split("+")[0], tmp_path / "plain.pt", "fp32", "all-to-all")
        assert not _same(a2a["params"], plain["params"])


def test_aps_takes_one_shift_a_parameter_over_all_its_shards():
    """APS in a library's order: FSDP's flat buffer holds each parameter as W shard segments; the shift
    is the whole parameter's (CPD's per-tensor scale), as the per-parameter orders take it. At W = 2
    gloo's order and rank order add the same two values, so the two must agree bit for bit, also
    when a parameter's shards differ by 2**20 in size (a shift per segment would not: the control)."""
    from bfp.distributed.fsdp import RoundedReduceScatter
    from bfp.distributed.reduce import RoundedReduce
    from bfp.formats import format_from_name
    fmt, world = format_from_name("e4m3"), 2
    shapes = [torch.Size((4, 3)), torch.Size((2, 5))]
    g = torch.Generator().manual_seed(3)
    stack = torch.randn(world, 22, generator=g)  # [worker, row 0 (6 + 5) | row 1 (6 + 5)]
    stack[:, 11:17] *= 2.0 ** -20  # parameter 0's shard 1: tiny
    gloo = RoundedReduceScatter(RoundedReduce(fmt, "gloo", aps=True), shapes, "all-gather")._reduce(stack, world)
    seq = RoundedReduceScatter(RoundedReduce(fmt, "sequential", aps=True), shapes, "all-gather")._reduce(stack, world)
    assert torch.equal(gloo, seq)
    per_segment = RoundedReduce(fmt, "gloo", aps=True)(stack, [6, 5] * world)
    assert not torch.equal(per_segment, gloo)
    with pytest.raises(ValueError, match="needs every parameter whole .* use the all-gather transport"):
        RoundedReduceScatter(RoundedReduce(format_from_name("fb16"), "sequential"), shapes, "all-to-all")
    with pytest.raises(ValueError, match="transport 'ring': allowed auto, all-gather, all-to-all"):
        RoundedReduceScatter(RoundedReduce(fmt, "gloo"), shapes, "ring")


def test_stochastic_rounding_reduces_each_shard_on_one_rank_reproducibly(tmp_path, fp32):
    """Issue 55, item 2: a stochastic e4m3 reduce-scatter over the all-to-all transport (each shard
    summed by one rank, with draws of its own seeded from the run's generator): two runs with the
    same seeds end with the same weights, which are not FP32's (the rounding ran)."""
    runs = [_run_rs(2, "simulate", "gloo", "e4m3+sr", tmp_path / f"sr{k}.pt", "fp32", "auto") for k in (0, 1)]
    assert runs[0]["calls"] == 9 and _same(runs[0]["params"], runs[1]["params"])
    assert not _same(runs[0]["params"], fp32)


def test_stochastic_gradient_rounding_needs_one_reducer_a_shard():
    import dataclasses
    from bfp.distributed.fsdp import RoundedReduceScatter
    from bfp.distributed.reduce import RoundedReduce
    from bfp.formats import format_from_name
    sr = dataclasses.replace(format_from_name("e4m3"), rounding="stochastic")
    with pytest.raises(ValueError, match="stochastic rounding cannot be a gradient format where every worker"):
        RoundedReduce(sr, order="gloo")
    reduce = RoundedReduce(sr, order="gloo", one_reducer=True)
    with pytest.raises(ValueError, match="needs each shard reduced by one rank, the all-to-all transport"):
        RoundedReduceScatter(reduce, [torch.Size((4,))], "all-gather")
    # 1 + 1/16 lies halfway between the e4m3 neighbours 1 and 1.125: stochastic sums take either, as often
    stack = torch.tensor([[1.0], [0.0625]]).expand(2, 4000).contiguous()
    draws = [RoundedReduce(sr, order="gloo", average=False, one_reducer=True,
                           generator=torch.Generator().manual_seed(s))(stack) for s in (1, 1, 2)]
    assert set(draws[0].unique().tolist()) == {1.0, 1.125}
    assert 0.45 < (draws[0] == 1.125).float().mean().item() < 0.55  # about 6 standard deviations either side
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])


def test_installing_needs_a_sharded_model_and_a_known_mode():
    import torch.nn as nn
    from bfp.distributed.fsdp import install_rounded_reduce_scatter
    from bfp.distributed.reduce import RoundedReduce
    from bfp.formats import format_from_name
    with pytest.raises(ValueError, match="mode 'x': allowed simulate, replay"):
        install_rounded_reduce_scatter(nn.Linear(2, 2), RoundedReduce(format_from_name("e4m3")), "x")
    with pytest.raises(ValueError, match="needs a model fully_shard has sharded"):
        install_rounded_reduce_scatter(nn.Linear(2, 2), RoundedReduce(format_from_name("e4m3")))


def test_the_rounded_all_gather_trains_as_rounding_the_master_before_every_forward(tmp_path, fp32):
    """Issue 55, item 3: the sharded FP32 master rounded to e4m3 as FSDP2 gathers it; the layers compute
    on the gathered values and the optimizer updates the master: one process that rounds its master
    before each forward gives the same master bit for bit, and not FP32's."""
    got = _launch(["--ag", "e4m3", tmp_path / "ag.pt"], tmp_path / "ag.pt")
    ref = tmp_path / "ref.pt"
    want = _launch(["--ag-reference", "e4m3", ref, 2], ref, ranks=False)
    assert got["calls"] > 0 and _same(got["params"], want)
    assert not _same(got["params"], fp32)


def test_a_bfloat16_param_dtype_rounds_twice_as_torchtitan_does(tmp_path):
    """Issue 55, item 3: ``MixedPrecisionPolicy(param_dtype=bfloat16)`` with the rounded all-gather:
    FSDP casts each shard to bfloat16, the comm rounds that to e4m3, the layers compute in bfloat16.
    One process computing in bfloat16 on e4m3(bfloat16(master)) gives the same master bit for bit; on
    e4m3(master), the single rounding, it does not (the double rounding shows)."""
    got = _launch(["--ag", "e4m3", tmp_path / "ag.pt", "bfloat16"], tmp_path / "ag.pt")
    ref = tmp_path / "ref.pt"
    want = _launch(["--ag-reference", "e4m3", ref, 2, "bfloat16", "ag"], ref, ranks=False)
    assert got["calls"] > 0 and _same(got["params"], want)
    once = _launch(["--ag-reference", "e4m3", ref, 2, "bfloat16", "fmt-first"], ref, ranks=False)
    assert not _same(got["params"], once)


def test_the_rounded_all_gather_takes_element_wise_formats_only():
    import torch.nn as nn
    from bfp.distributed.fsdp import install_rounded_all_gather
    from bfp.formats import format_from_name
    with pytest.raises(ValueError, match="element-wise format with deterministic rounding.*got BlockFloat"):
        install_rounded_all_gather(nn.Linear(2, 2), format_from_name("fb16"))
    with pytest.raises(ValueError, match="needs a model fully_shard has sharded"):
        install_rounded_all_gather(nn.Linear(2, 2), format_from_name("e4m3"))


def test_cifar_py_fsdp_trains_as_ddp_with_the_same_rounded_reduction(tiny_args, tmp_path):
    """Issue 55, item 5: ``--fsdp`` under torchrun (2 gloo ranks) with an e4m3 sequential gradient
    reduction trains exactly as DDP with the same rounded hook (losses to the last digit: FSDP gathers
    the same weights, and its reduce-scatter adds what DDP's all-reduce adds); lm.py runs under --fsdp
    with its weights all-gathered in bfloat16."""
    import json
    from test_distributed import launch
    common = ["--bfp", "any_FB16", "--training-epochs", "2", "--grad-format", "e4m3", "--grad-order", "sequential",
              "--log", "True", "--save", "True", "--save-interval", "1"]
    runs = tmp_path / "runs"
    copy = runs / "fsdp_resumed"  # a copy of the FSDP run continues from its epoch-1 checkpoint
    out = launch(["cifar", json.dumps([tiny_args(*common, "--fsdp", "True", "--run-name", "fsdp"),
                                       tiny_args(*common, "--run-name", "ddp"),
                                       {"copy_run": [str(runs / "fsdp"), str(copy)]},
                                       ["--resume", str(copy / "checkpoints" / "epoch_001.pt"), "--progress", "False"],
                                       *refused_resumes(copy / "checkpoints" / "epoch_001.pt"),
                                       *refused_resumes(runs / "ddp" / "checkpoints" / "epoch_001.pt"),
                                       ])], timeout=400)[0]
    # an edited checkpoint is refused before the first step, by DDP and FSDP alike, naming the entry
    assert out.count("does not fit the model built from its flags (ValueError: the model's state does not fit "
                     "the model: missing entries conv1.weight)") == 2, out[-3000:]
    assert out.count("the optimizer's 'momentum_buffer' of conv1.weight is float32 [5123]; the parameter is "
                     "float32 [") == 2, out[-3000:]
    assert "FSDP2 (fully_shard per block and the root)" in out, out[-3000:]
    metrics = {n: [(r["train_loss"], r["test_loss"], r["test_acc1"]) for r in
                   map(json.loads, (runs / n / "metrics.jsonl").read_text().splitlines())] for n in ("fsdp", "ddp")}
    assert len(metrics["fsdp"]) == 2 and metrics["fsdp"] == metrics["ddp"]
    # checkpoints through torch.distributed.checkpoint's state-dict API: the whole model, as DDP saves it,
    # and a resume that continues the run exactly (weights, BatchNorm statistics, momentum)
    fsdp, ddp, resumed = (torch.load(runs / n / "checkpoints" / "last.pt", weights_only=False)
                          for n in ("fsdp", "ddp", "fsdp_resumed"))
    assert fsdp["global_step"] == resumed["global_step"] == 4 and fsdp["model"].keys() == ddp["model"].keys()
    assert all(torch.equal(fsdp["model"][k], ddp["model"][k]) and torch.equal(fsdp["model"][k], resumed["model"][k])
               for k in ddp["model"])
    momentum = [(n, s["momentum_buffer"]) for n, s in fsdp["optimizer"]["state"].items()]
    assert [n for n, _ in momentum] == [k for k, _ in ddp_params(ddp)]  # keyed by parameter name: any sharding
    assert all(torch.equal(m, resumed["optimizer"]["state"][n]["momentum_buffer"]) for n, m in momentum)
    assert all(torch.equal(m, ddp["optimizer"]["state"][i]["momentum_buffer"]) for i, (_, m) in enumerate(momentum))
    lm = ["--model-opt", "dim=32", "--model-opt", "depth=2", "--model-opt", "heads=2", "--block-size", "16",
          "--batch-size-train", "16", "--batch-size-test", "32", "--threads", "1", "--progress", "False",
          "--sample-chars", "8", "--bfp", "any_fp8_e4m3", "--training-epochs", "1", "--limit-train-images", "64",
          "--limit-test-images", "32", "--device", "cpu", "--fsdp", "True", "--param-comm-format", "bfloat16",
          "--grad-format", "e5m2", "--run-dir", str(tmp_path / "lm")]
    out = launch(["cifar", json.dumps([{"task": "lm", "argv": lm}])], timeout=400)[0]
    assert "weights all-gathered in Float(e8m7" in out and "epoch 1/1" in out, out[-3000:]


def refused_resumes(checkpoint):
    """Runs of the distributed worker that resume ``checkpoint`` edited (a model entry dropped; a
    momentum buffer of another shape) and must end with exit status 2."""
    items = []
    for how in ("drop_model_entry", "optimizer_shape"):  # each in a run directory of its own, as a branch
        run = checkpoint.parent.parent
        edited = run.with_name(f"{run.name}_{how}") / "checkpoints" / checkpoint.name
        items += [{"edit_checkpoint": [str(checkpoint), str(edited), how]},
                  {"task": "cifar", "argv": ["--resume", str(edited), "--progress", "False"], "expect": 2}]
    return items


def ddp_params(state):
    """The trainable parameters' names of a saved model, in the optimizer's order (its state's keys)."""
    return [(k, v) for k, v in state["model"].items() if not k.endswith(("running_mean", "running_var",
                                                                         "num_batches_tracked"))]


@pytest.mark.parametrize("flags, message", [
    (["--param-comm-format", "e4m3"], "--param-comm-format e4m3 rounds FSDP's weight all-gather: add --fsdp"),
    (["--fsdp", "True", "--do", "Simple/0.1/0.2/0/1"], "--fsdp does not combine with --do yet (dynamic precision"),
    (["--fsdp", "True", "--emulate-node", "2"], "--fsdp shards over processes, one worker each"),
    (["--fsdp", "True"], "--fsdp shards the model over processes: launch with torchrun"),
    (["--fsdp", "True", "--bucket-cap-mb", "1"], "--bucket-cap-mb 1.0 sizes DDP's gradient buckets; --fsdp"),
    (["--fsdp", "True", "--param-comm-format", "p3109_k8p4se_sr"],
     "--param-comm-format p3109_k8p4se_sr: each rank rounds its own shard before the all-gather, so the rounding "
     "must be deterministic"),
    (["--fsdp", "True", "--param-comm-format", "nvfp4_sr"], "--param-comm-format nvfp4_sr: FSDP gathers one flat"),
])
def test_fsdp_flags_are_refused_where_they_cannot_work(tiny_args, capsys, flags, message):
    from bfp.cli import cifar as main
    assert main(tiny_args("--bfp", "any_FB16", "--training-epochs", "1", *flags)) == 2
    assert message in capsys.readouterr().err
