"""--do: no decision where training ends (its bits would never be used by a training step)."""
from types import SimpleNamespace

import torch

from bfp.dynamic import CSV_NAME, DynamicPrecision, read_log
from bfp.formats import BlockFloat
from bfp.layers import QConv2d
from bfp.precision import LayerPrecision

POINTS = ("fw", "fi", "bwo", "bwi", "bio", "biw")


class FakeTrainer(SimpleNamespace):
    def log(self, msg):
        self.messages.append(msg)


def make(every, epochs, steps_per_epoch, tmp_path):
    torch.manual_seed(0)
    fmt = BlockFloat(4, (1, 4, 3, 3))
    model = torch.nn.Sequential(QConv2d.from_float(torch.nn.Conv2d(6, 8, 3, padding=1, bias=False),
                                                   LayerPrecision(**{p: fmt for p in POINTS})))
    trainer = FakeTrainer(model=model, writer=None, run_dir=tmp_path, global_step=0, epoch=0, messages=[],
                          epochs=epochs, schedule=SimpleNamespace(total_steps=epochs * steps_per_epoch))
    return model, trainer, DynamicPrecision(model, "Simple/0.02/0.05/0/0", every=every)


def train(model, trainer, dp, epochs, steps_per_epoch):
    dp.on_train_start(trainer)
    for epoch in range(epochs):
        trainer.epoch = epoch
        for _ in range(steps_per_epoch):
            model(torch.randn(2, 6, 5, 5)).square().sum().backward()
            trainer.global_step += 1
            dp.on_batch_end(trainer, trainer.global_step)
        dp.on_epoch_end(trainer, epoch, {})
    dp.on_train_end(trainer)
    return sorted({(int(r["decision"]), int(r["epoch"]), int(r["step"])) for r in read_log(trainer.run_dir)})


def test_every_epoch_skips_the_decision_at_the_end_of_the_last_epoch(tmp_path):
    model, trainer, dp = make("epoch", 3, 2, tmp_path)
    assert train(model, trainer, dp, 3, 2) == [(0, 0, 2), (1, 1, 4)]
    assert dp.controller.decision == 2
    assert trainer.messages[-1] == ("dynamic precision: no decision at the end of the last epoch (3): "
                                    "no training step would use its bits")


def test_every_n_steps_skips_a_decision_after_the_last_step_only(tmp_path):
    model, trainer, dp = make(2, 2, 3, tmp_path)  # steps 1..6, decisions due at 2, 4, 6
    assert train(model, trainer, dp, 2, 3) == [(0, 0, 2), (1, 1, 4)]
    assert trainer.messages[-1] == ("dynamic precision: no decision after the last training step (6): "
                                    "no training step would use its bits")
    model, trainer, dp = make(4, 2, 3, tmp_path / "b")  # due at 4 only: the last step (6) is not due
    (tmp_path / "b").mkdir()
    assert train(model, trainer, dp, 2, 3) == [(0, 1, 4)]
    assert not any("no decision" in m for m in trainer.messages)
    assert (tmp_path / "b" / CSV_NAME).is_file()
