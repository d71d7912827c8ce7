"""bfp.optim: SGD, AdamW (momentum as beta1) and LARS behind --optimizer / --use-lars."""
import pytest
import torch

from bfp.cli import cifar
from bfp.engine import checkpoint as ckpt
from bfp.engine.trainer import TrainConfig
from bfp.optim import FACTORIES, adamw, set_momentum, sgd


def test_adamw_takes_lr_beta1_and_decoupled_weight_decay_from_the_config():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = adamw([p], TrainConfig(lr=0.01, momentum=0.8, weight_decay=0.1))
    assert isinstance(opt, torch.optim.AdamW) and FACTORIES["adamw"] is adamw
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"], g["eps"]) == (0.01, (0.8, 0.999), 0.1, 1e-8)
    p.grad = torch.tensor([0.5, 0.5])
    opt.step()
    # first AdamW step: p * (1 - lr * wd) - lr * sign(grad) (bias-corrected m / sqrt(v) = 1)
    want = torch.tensor([1.0, -2.0]) * (1 - 0.01 * 0.1) - 0.01 * 0.5 / (0.5 + 1e-8)
    assert torch.allclose(p.detach(), want, atol=1e-7, rtol=0)


def test_a_plans_momentum_is_sgds_momentum_and_adams_beta1():
    p = torch.nn.Parameter(torch.zeros(2))
    a, s = adamw([p], TrainConfig()), sgd([p], TrainConfig())
    set_momentum(a, 0.5)
    set_momentum(s, 0.5)
    assert a.param_groups[0]["betas"] == (0.5, 0.999) and "momentum" not in a.param_groups[0]
    assert s.param_groups[0]["momentum"] == 0.5


def test_cifar_py_trains_with_adamw_and_refuses_it_with_lars(tiny_args, capsys, tmp_path):
    assert cifar(tiny_args("--training-epochs", "1", "--optimizer", "adamw", "--optim-lr", "0.003",
                           "--save", "True", "--run-name", "a")) == 0
    state = ckpt.load(tmp_path / "runs" / "a" / "checkpoints" / "last.pt")
    assert state["extra"]["args"]["optimizer"] == "adamw"
    moments = next(iter(state["optimizer"]["state"].values()))
    assert {"exp_avg", "exp_avg_sq"} <= set(moments)  # Adam's moments, not SGD's momentum buffer
    assert cifar(tiny_args("--optimizer", "adamw", "--use-lars", "True")) == 2
    assert "--use-lars scales SGD's steps layer by layer; it does not combine with --optimizer adamw" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cifar(tiny_args("--optimizer", "adam"))


def test_a_checkpoint_from_before_the_optimizer_flag_resumes_with_sgd(tiny_args, tmp_path):
    from bfp.cli.resume import apply_resume
    from bfp.cli.tasks import LM
    from bfp.cli.train_config import parse_args
    run = tmp_path / "runs" / "old"
    assert cifar(tiny_args("--training-epochs", "1", "--save", "True", "--run-name", "old")) == 0
    last = run / "checkpoints" / "last.pt"
    state = ckpt.load(last)
    del state["extra"]["args"]["optimizer"]
    ckpt.save(state, last)
    args, _, _ = parse_args(LM, ["--resume", str(run)])  # lm.py's own default is adamw
    assert apply_resume(LM, args)[0].optimizer == "sgd"


def test_adamw_beta1_of_one_is_refused_from_flags_and_training_configs(tmp_path, tiny_args, capsys):
    import json
    from bfp.cli import cifar as cifar_main
    assert cifar_main(tiny_args("--optimizer", "adamw", "--optim-momentum", "1.0", "--training-epochs", "1")) == 2
    assert "--optim-momentum is AdamW's beta1 under --optimizer adamw and must be in [0, 1), got 1.0" in \
        capsys.readouterr().err
    tc = tmp_path / "tc.json"
    tc.write_text(json.dumps({"optimizer-dict": {"1": {"momentum": 1.0}}, "training-epochs": 2}))
    assert cifar_main(tiny_args("--optimizer", "adamw", "-tc", str(tc))) == 2
    err = capsys.readouterr().err
    assert "optimizer-dict[1]['momentum'] is AdamW's beta1" in err and "Traceback" not in err
    assert cifar_main(tiny_args("--optimizer", "sgd", "--optim-momentum", "1.0", "--training-epochs", "1")) == 0
