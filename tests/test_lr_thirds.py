"""The original ImageNet learning-rate schedule: 10x lower at each third of the epochs (exact values)."""
import pytest
import torch

from bfp.engine.lr_thirds import ThirdsSchedule


def lrs(epochs, steps_per_epoch, warmup=0):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    s = ThirdsSchedule(opt, total_steps=epochs * steps_per_epoch, warmup_steps=warmup, epochs=epochs)
    out = [s.get_last_lr()[0]]
    for _ in range(epochs * steps_per_epoch - 1):
        s.step()
        out.append(s.get_last_lr()[0])
    return out, s


def test_thirds_schedule_drops_10x_at_each_third_of_the_epochs():
    out, _ = lrs(90, 1)
    assert out == [0.5] * 30 + [0.5 * 0.1] * 30 + [0.5 * (0.1 ** 2)] * 30  # the example's epochs 30 and 60
    out, _ = lrs(4, 2)   # epochs 0..3: 3e // 4 = 0, 0, 1, 2
    assert out == [0.5, 0.5, 0.5, 0.5, 0.5 * 0.1, 0.5 * 0.1, 0.5 * 0.1 ** 2, 0.5 * 0.1 ** 2]
    out, _ = lrs(3, 2, warmup=2)
    assert out == [0.5 * 1 / 2, 0.5 * 2 / 2, 0.5 * 0.1, 0.5 * 0.1, 0.5 * 0.1 ** 2, 0.5 * 0.1 ** 2]


def test_thirds_schedule_state_round_trips():
    _, s = lrs(3, 2)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    t = ThirdsSchedule(opt, total_steps=6, epochs=3)
    t.load_state_dict(s.state_dict())
    assert t.get_last_lr() == s.get_last_lr() and t.state_dict() == s.state_dict()
    with pytest.raises(ValueError, match="total_steps 7 must be a positive multiple of epochs 3"):
        ThirdsSchedule(opt, total_steps=7, epochs=3)


def test_a_loaded_state_keeps_its_own_epochs_and_steps_per_epoch():
    # saved: 2 epochs of 3 steps, at step 2; restored into a schedule built for 3 epochs of 2 steps
    opt_s = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    s = ThirdsSchedule(opt_s, total_steps=6, epochs=2)
    s.step(), s.step()
    opt_t = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    t = ThirdsSchedule(opt_t, total_steps=6, epochs=3)
    t.load_state_dict(s.state_dict())
    got, want = [t.get_last_lr()[0]], [s.get_last_lr()[0]]
    for _ in range(3):
        s.step(), t.step()
        got.append(t.get_last_lr()[0]), want.append(s.get_last_lr()[0])
    assert got == want == [0.5, 0.5 * 0.1, 0.5 * 0.1, 0.5 * 0.1]
    assert t.state_dict() == s.state_dict()
