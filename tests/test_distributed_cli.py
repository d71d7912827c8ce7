"""cifar.py distributed: 2 gloo processes end where one process emulating 2 workers ends; flags and errors."""
import json

import pytest
import torch

from bfp.cli import cifar as main
from bfp.cli.flags import build_parser
from bfp.cli.tasks import CIFAR
from test_distributed import launch


def final_state(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)


def assert_same_training(a, b, what):
    assert a["global_step"] == b["global_step"] == 4
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:  # weights and BatchNorm running statistics
        assert torch.equal(a["model"][k], b["model"][k]), (what, k)
    for k, s in a["optimizer"]["state"].items():
        assert torch.equal(s["momentum_buffer"], b["optimizer"]["state"][k]["momentum_buffer"]), (what, k)
    assert [h["test_acc1"] for h in a["history"]] == [h["test_acc1"] for h in b["history"]]


def test_two_gloo_processes_equal_one_process_emulating_two_workers(tiny_args, tmp_path):
    common = ["--training-epochs", "2", "--save", "True", "--save-interval", "1", "--grad-exp", "4",
              "--grad-man", "3", "--optim-lr", "0.05"]
    variants = {"plain": [], "aps": ["--use-aps"]}
    runs = [tiny_args(*common, *extra, "--run-name", f"ddp_{v}") for v, extra in variants.items()]
    # --resume under 2 processes: a copy of the plain run continues from its epoch-1 checkpoint
    copy = tmp_path / "runs" / "ddp_resumed"
    runs += [{"copy_run": [str(tmp_path / "runs" / "ddp_plain"), str(copy)]},
             ["--resume", str(copy / "checkpoints" / "epoch_001.pt"), "--progress", "False"]]
    launch(["cifar", json.dumps(runs)], timeout=240)
    for v, extra in variants.items():
        assert main(tiny_args(*common, *extra, "--emulate-node", "2", "--run-name", f"emu_{v}")) == 0
        ddp, emu = (final_state(tmp_path / "runs" / f"{k}_{v}") for k in ("ddp", "emu"))
        assert_same_training(ddp, emu, v)
    assert_same_training(final_state(copy), final_state(tmp_path / "runs" / "ddp_plain"), "resumed")
    # APS changed the training (the test can tell the two variants apart)
    a, b = final_state(tmp_path / "runs" / "emu_plain"), final_state(tmp_path / "runs" / "emu_aps")
    assert any(not torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_original_spellings_are_accepted():
    args = build_parser(CIFAR).parse_args(["--grad_exp", "4", "--grad_man", "3", "--use_APS", "--use_kahan",
                                           "--use_lars", "--emulate_node", "8"])
    assert (args.grad_exp, args.grad_man, args.use_aps, args.use_kahan, args.use_lars, args.emulate_node) == \
        (4, 3, True, True, True, 8)


def _no_launcher(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(v, raising=False)


@pytest.mark.parametrize("flags, env, message", [
    (["--emulate-node", "0"], {}, "--emulate-node must be >= 1 (workers emulated per process), got 0"),
    (["--batch-size-train", "30", "--emulate-node", "4"], {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"},
     "--batch-size-train 30 (the global batch) is not divisible by 8 workers (2 process(es) x --emulate-node 4)"),
    ([], {"RANK": "0", "WORLD_SIZE": "2"},
     "RANK/WORLD_SIZE describe 2 processes but MASTER_ADDR is not set"),
    ([], {"SLURM_PROCID": "1", "SLURM_NTASKS": "8"}, "Slurm (srun) describe 8 processes but MASTER_ADDR is not set"),
    (["--grad-exp", "9", "--grad-man", "3"], {}, "--grad-exp 9 --grad-man 3: Float exp (exponent bits) must be"),
    (["--grad-exp", "1", "--grad-man", "2"], {}, "--grad-exp 1 --grad-man 2: Float(exp=1) with encoding='ieee'"),
    (["--grad-exp", "4"], {}, "--grad-exp and --grad-man go together"),
    (["--grad-format", "e4m3", "--grad-man", "3"], {}, "give either --grad-format or --grad-exp/--grad-man"),
    (["--grad-format", "e9m9"], {}, "--grad-format e9m9: unknown format name"),
    ([], {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "abc"},
     "MASTER_PORT='abc' is not a port number: allowed an integer in 1..65535"),
    ([], {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "99999"}, "MASTER_PORT='99999'"),
    ([], {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "-1"}, "MASTER_PORT='-1'"),
    (["--dist-timeout", "0"], {}, "--dist-timeout must be a number of seconds > 0, got 0.0"),
])
def test_bad_distributed_input_is_a_usage_error(tiny_args, monkeypatch, capsys, flags, env, message):
    _no_launcher(monkeypatch)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(tiny_args("--training-epochs", "1", *flags)) == 2
    assert message in capsys.readouterr().err


def test_four_processes_of_eight_emulated_workers_equal_one_process_of_thirty_two(tiny_args, tmp_path):
    """The issue's check: 4 gloo processes x --emulate-node 8 (each holding its own 8 workers'
    gradients; the partial sums go round the ring) train exactly as one process emulating 32."""
    common = ["--training-epochs", "1", "--save", "True", "--grad-exp", "4", "--grad-man", "3", "--use-aps",
              "--batch-size-train", "64", "--optim-lr", "0.05"]
    launch(["cifar", json.dumps([tiny_args(*common, "--emulate-node", "8", "--run-name", "ddp",
                                           train_images=128)])], world=4, timeout=480)
    assert main(tiny_args(*common, "--emulate-node", "32", "--run-name", "emu", train_images=128)) == 0
    a, b = (final_state(tmp_path / "runs" / k) for k in ("ddp", "emu"))
    assert a["global_step"] == b["global_step"] == 2
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k, s in a["optimizer"]["state"].items():
        assert torch.equal(s["momentum_buffer"], b["optimizer"]["state"][k]["momentum_buffer"]), k


@pytest.mark.parametrize("order", ["gloo", "nccl-ring", "nccl-tree"])
def test_library_orders_train_from_the_command_line_and_say_so(tiny_args, capsys, order):
    assert main(tiny_args("--training-epochs", "1", "--emulate-node", "4", "--grad-format", "e4m3",
                          "--grad-order", order, *(["--nodes", "2"] if order == "nccl-tree" else []),
                          "--nccl-channels", "2")) == 0
    out = capsys.readouterr().out
    assert f"{order} order" in out and ("2 channel(s)" in out) == order.startswith("nccl")


def test_grad_format_truncation_and_aps_without_a_format_warn(tiny_args, capsys):
    assert main(tiny_args("--training-epochs", "1", "--emulate-node", "2", "--grad-format", "fb16")) == 0
    assert "truncates: every partial sum of the all-reduce is cut toward zero" in capsys.readouterr().err
    assert main(tiny_args("--training-epochs", "1", "--emulate-node", "2", "--use-aps")) == 0
    assert "--use-aps scales the gradients into a gradient format, but none is given" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--grad-order", "nccl-tree", "--nodes", "3"], "--nodes 3 does not divide the 4 workers"),
    (["--grad-order", "gloo", "--grad-format", "fb16"], "block format, whose tiles the cuts would split"),
    (["--grad-order", "nccl-ring", "--nccl-channels", "0"], "--nccl-channels must be an integer in 1..64"),
])
def test_bad_order_settings_are_usage_errors(tiny_args, capsys, flags, message):
    assert main(tiny_args("--training-epochs", "1", "--emulate-node", "4", "--grad-format", "e4m3", *flags)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_loss_scaler_skips_a_step_whose_reduced_sum_overflows(tiny_args, tmp_path):
    """No layer is quantized, so only the all-reduce (saturating e5m2, no APS) can overflow: a huge
    initial loss scale must be backed off after skipped steps, as for a layer's gradient points."""
    args = tiny_args("--training-epochs", "1", "--emulate-node", "2", "--grad-format", "e5m2", "--loss-scale",
                     "dynamic", "--loss-scale-init", "1e12", "--log", "True", "--run-name", "ov")
    assert main(args) == 0
    epoch = json.loads((tmp_path / "runs" / "ov" / "metrics.jsonl").read_text().splitlines()[0])
    assert epoch["skipped_steps"] >= 1 and epoch["loss_scale"] < 1e12
    from bfp.distributed.reduce import RoundedReduce
    from bfp.formats import format_from_name
    from bfp.overflow import OverflowFlag, watching
    flag = OverflowFlag()
    with watching(flag):  # the reduction reports a partial sum beyond e5m2's 57344, not only a worker's value
        RoundedReduce(format_from_name("e5m2"), order="sequential", average=False)(torch.full((2, 3), 40000.0))
    assert bool(flag.pop()) and flag.pop() is None


@pytest.mark.parametrize("flags, what", [
    (["--mode", "generate-config", "--config-out", "gen.json"], "--mode generate-config"),
    (["--mode", "diagnose"], "--mode diagnose"),
    (["--compare", "True"], "--compare"),
])
def test_one_process_modes_are_refused_under_a_launcher_by_rank_0_alone(tiny_args, monkeypatch, capsys, tmp_path,
                                                                          flags, what):
    from bfp.cli import cifar as main
    monkeypatch.chdir(tmp_path)
    for rank in (0, 1):
        for k, v in dict(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999").items():
            monkeypatch.setenv(k, v)
        assert main(tiny_args("--bfp", "any_FB16", *flags)) == 2
        err = capsys.readouterr().err
        assert (f"{what} runs in one process; this one is rank 0 of 2 (RANK/WORLD_SIZE)" in err) == (rank == 0), err
    assert not (tmp_path / "gen.json").exists()
    for k in ("RANK", "WORLD_SIZE"):  # the control: one process, the mode runs
        monkeypatch.delenv(k)
    if what == "--mode generate-config":
        assert main(tiny_args("--bfp", "any_FB16", *flags)) == 0 and (tmp_path / "gen.json").exists()


def test_a_finished_run_leaves_its_process_group_before_it_returns(tiny_args, monkeypatch, tmp_path):
    """Not at exit: a group torn down by the interpreter's exit handlers can race its threads."""
    import torch.distributed as dist
    import importlib
    cli = importlib.import_module("bfp.cli.main")

    def train(spec):  # a run that joined a group (one process, a file store) and finished
        dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
        assert dist.is_initialized()
    monkeypatch.setattr(cli, "train", train)
    args = tiny_args("--bfp", "any_FB16", "--training-epochs", "1")
    assert cli.run_task("cifar", args) == 0 and dist.is_initialized()  # in-process callers keep their group
    dist.destroy_process_group()
    (tmp_path / "store").unlink(missing_ok=True)
    assert cli.run_task("cifar", args, leave_group=True) == 0  # as the scripts and the bfp command run
    assert not dist.is_initialized()


def test_an_error_every_rank_meets_is_printed_by_rank_0_alone(monkeypatch):
    import importlib
    from bfp.cli.flags import UsageError
    cli = importlib.import_module("bfp.cli.main")
    same, own = UsageError("no data", every_rank=True), UsageError("rank 1 cannot reach rank 0")
    for env, silent in (({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, True),
                        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, False),
                        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, False),  # another machine's files
                        ({}, False)):
        for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert cli.said_by_rank_0(same) is silent, env
        assert cli.said_by_rank_0(own) is False
