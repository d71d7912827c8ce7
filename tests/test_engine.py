"""bfp.engine: data, schedule, epoch plans, train/eval modes and callbacks."""
import math

import pytest
import torch
import torch.nn as nn

import bfp
import bfp.models
from bfp.engine import Callback, EpochPlan, TrainConfig, Trainer
from bfp.data import cifar as D
from bfp.cli.run import cpu_threads
from bfp.engine.schedule import CosineSchedule


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads and lose a lot on a busy machine."""
    with cpu_threads(1):
        yield


def digits(**kw):
    kw = {"batch_size_train": 32, "batch_size_test": 32, "limit_train": 64, "limit_test": 32, **kw}
    return D.load("digits", **kw)


def tiny_model(seed=0, classes=10):
    torch.manual_seed(seed)
    return bfp.models.create("ResNet10", classes, width=4)


# ---- data ----------------------------------------------------------------------------

def test_digits_split_is_fixed_and_images_are_32x32():
    a, b = D.load("digits"), D.load("digits", seed=5)
    assert len(a.train.dataset) == 1437 and len(a.test.dataset) == 360
    assert torch.equal(a.test.dataset.images, b.test.dataset.images)
    assert a.train.dataset.images.shape[1:] == (3, 32, 32) and a.num_classes == 10
    assert a.train.dataset.images[:, :, :4].max() == 0  # the 4-pixel zero border
    one = D.load("digits", channels=1)
    assert one.in_channels == 1 and one.train.dataset.images.shape[1] == 1


def test_test_data_is_never_augmented():
    b = digits()
    first = [x for x, _ in b.test]
    second = [x for x, _ in b.test]
    assert b.test.augment is None and all(torch.equal(p, q) for p, q in zip(first, second))
    imgs = b.test.dataset.images[:32].float()
    expect = (imgs - b.test.mean) / b.test.std
    assert torch.equal(first[0], expect)


@pytest.mark.parametrize("gpu_data", [False, True], ids=["DataLoader", "TensorLoader"])
def test_image_folder_test_data_is_not_augmented_and_normalised_as_training_data(tmp_path, gpu_data):
    from PIL import Image
    colour = (10, 200, 90)
    for split in ("train", "test"):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (32, 32), colour).save(tmp_path / split / cls / f"{i}.png")
    b = D.load("imagefolder", str(tmp_path), batch_size_train=8, batch_size_test=8, num_workers=0,
               gpu_data=gpu_data)
    mean, std = torch.tensor(D.IMAGENET_MEAN)[:, None, None], torch.tensor(D.IMAGENET_STD)[:, None, None]
    image = (torch.tensor(colour, dtype=torch.float32)[:, None, None] / 255 - mean) / std
    zero = -mean / std
    (x_test, _), = list(b.test)
    torch.testing.assert_close(x_test, image.expand(8, 3, 32, 32).contiguous(), rtol=0, atol=1e-5)
    (x_train, _), = list(b.train)
    # a crop of the zero-padded image: every pixel is the image's or padding, normalised alike
    is_image = (x_train - image).abs().amax(1) < 1e-5
    is_zero = (x_train - zero).abs().amax(1) < 1e-5
    assert (is_image | is_zero).all() and is_image.any()


def test_augmentation_is_a_crop_of_the_padded_image_and_follows_the_generator():
    ds = D.TensorDataset(torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8), torch.zeros(16))
    loader = D.TensorLoader(ds, 16, (0, 0, 0), (1 / 255, 1 / 255, 1 / 255), augment=D.Augment(pad=4, flip=True),
                            generator=torch.Generator().manual_seed(0))
    (x, _), = list(loader)
    padded = nn.functional.pad(ds.images.float(), (4, 4, 4, 4))
    for i in range(16):  # every output is one of the 81 x 2 crops/flips of its padded input
        hits = [(dy, dx, f) for dy in range(9) for dx in range(9) for f in (False, True)
                if torch.equal(x[i], (lambda c: c.flip(2) if f else c)(padded[i, :, dy:dy + 32, dx:dx + 32]))]
        assert hits, i
    loader.generator.manual_seed(0)
    (again, _), = list(loader)
    assert torch.equal(x, again)


def test_unknown_dataset_and_missing_paths_are_clear(tmp_path):
    with pytest.raises(D.DataError, match=r"unknown dataset 'mnist'; allowed: digits, CIFAR10"):
        D.load("mnist")
    with pytest.raises(D.DataError, match=str(tmp_path / "nope")):
        D.load("CIFAR10", str(tmp_path / "nope"), download=False)
    with pytest.raises(D.DataError, match="not an image folder"):
        D.load("imagefolder", str(tmp_path))


def test_image_folder_loads_and_autodetects_from_a_parent_dir(tmp_path):
    from PIL import Image
    for split, n in (("train", 4), ("test", 2)):
        for cls in ("cat", "dog"):
            d = tmp_path / "jpg" / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (32, 32), (i * 40, 0, 255 if cls == "dog" else 0)).save(d / f"{i}.jpg")
    b = D.load("CIFAR10", str(tmp_path), batch_size_train=4, num_workers=0)  # JPEG CIFAR-10 layout
    assert b.classes == ["cat", "dog"] and len(b.train.dataset) == 8
    x, y = next(iter(b.test))
    assert x.shape == (4, 3, 32, 32)
    g = D.load("imagefolder", str(tmp_path / "jpg"), gpu_data=True, batch_size_train=4)
    assert g.train.dataset.images.dtype == torch.uint8 and len(g.test.dataset) == 4


# ---- schedule and plans ----------------------------------------------------------------

def test_cosine_with_warmup():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    s = CosineSchedule(opt, total_steps=10, warmup_steps=2)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        s.step()
    assert lrs[:3] == [0.5, 1.0, 1.0]
    assert lrs[3] == pytest.approx(0.5 * (1 + math.cos(math.pi / 8)))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0)


def test_plan_rejects_bad_keys_with_the_source_named():
    with pytest.raises(ValueError, match=r"f\.json: optimizer-dict\['3'\] has unknown key 'lrate'"):
        EpochPlan.parse(None, {"3": {"lrate": 0.1}}, "f.json")
    with pytest.raises(ValueError, match="bfp-layer-conf-dict key 'ten' is not an epoch"):
        EpochPlan.parse({"ten": "x"}, None, "f.json")
    with pytest.raises(ValueError, match=r"epochs \[5\] but the run trains epochs 0..3"):
        EpochPlan.parse({"5": "x"}, None, "f.json").check_epochs(4, "f.json")
    with pytest.raises(ValueError, match=r"optimizer-dict\['2'\]\['lr'\] must be a number in \[0, 3.4e38\] "
                                         r"\(float32's range\), got -0.1"):
        EpochPlan.parse(None, {"2": {"lr": -0.1}}, "f.json")
    with pytest.raises(ValueError, match=r"\['momentum'\] must be a number in \[0, 1\], got 'high'"):
        EpochPlan.parse(None, {"2": {"momentum": "high"}}, "f.json")
    with pytest.raises(ValueError, match=r"\['momentum'\] must be a number in \[0, 1\], got 5"):
        EpochPlan.parse(None, {"2": {"momentum": 5}}, "f.json")
    # the original's scheduler-step is accepted and changes nothing
    assert EpochPlan.parse(None, {"2": {"scheduler-step": 2}}, "f").optimizer == {2: {}}


class Recorder(Callback):
    name = "recorder"

    def __init__(self):
        self.lrs, self.modes, self.bits, self.events = [], [], {}, []

    def on_train_start(self, trainer):
        self.events.append("start")

    def on_epoch_start(self, trainer, epoch):
        self.modes.append(trainer.model.training)
        self.bits[epoch] = trainer.model.layer1[0].conv1.precision.fw.bits

    def on_batch_end(self, trainer, step):
        assert step == trainer.global_step and trainer.model.training
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])

    def on_epoch_end(self, trainer, epoch, metrics):
        assert not trainer.model.training  # just evaluated
        self.events.append(("epoch", epoch, sorted(metrics)))

    def on_train_end(self, trainer):
        self.events.append("end")

    def state_dict(self):
        return {"n": len(self.lrs)}

    def load_state_dict(self, d):
        self.loaded = d


def _train(plan, epochs=2, callbacks=(), precision="ResNet18_FB16"):
    model = tiny_model() if precision is None else bfp.convert(tiny_model(), precision)
    t = Trainer(model, digits(), TrainConfig(epochs=epochs, lr=0.1, progress=False), plan=plan,
                network_config=precision, callbacks=callbacks)
    t.fit()
    return t


def test_precision_switch_changes_formats_and_keeps_the_lr_schedule():
    rec_switch, rec_plain = Recorder(), Recorder()
    switch = EpochPlan.parse({"0": "ResNet18_FB16", "1": "ResNet18_FB12"}, {"1": {"scheduler-step": 1}}, "t")
    t = _train(switch, callbacks=[rec_switch])
    _train(EpochPlan(), callbacks=[rec_plain])
    assert rec_switch.bits == {0: 8, 1: 4}  # FB16 -> 8 mantissa bits, FB12 -> 4
    assert rec_plain.bits == {0: 8, 1: 8}
    assert rec_switch.lrs == rec_plain.lrs  # the switch did not restart the schedule
    assert t.network_config == "ResNet18_FB12"
    assert rec_switch.modes[1:] == [False]  # evaluated last; train_epoch switches back
    assert rec_switch.events[0] == "start" and rec_switch.events[-1] == "end"
    assert rec_switch.events[1][2] == sorted(["train_loss", "train_acc1", "train_acc5", "test_loss",
                                              "test_acc1", "test_acc5", "lr", "images_per_s", "epoch_time_s"])


class LRs(Callback):
    name = "lrs"

    def __init__(self):
        self.lrs = []

    def on_batch_end(self, trainer, step):
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def test_optimizer_dict_lr_rescales_without_restarting():
    rec_a, rec_b = LRs(), LRs()
    _train(EpochPlan(), callbacks=[rec_a], precision=None)
    _train(EpochPlan.parse(None, {"1": {"lr": 0.01, "momentum": 0.5}}, "t"), callbacks=[rec_b], precision=None)
    n = len(rec_a.lrs) // 2
    assert rec_a.lrs[:n] == rec_b.lrs[:n]
    assert rec_b.lrs[n:] == pytest.approx([lr / 10 for lr in rec_a.lrs[n:]])


def test_model_is_back_in_train_mode_after_evaluation():
    seen = []

    class Spy(Callback):
        name = "spy"

        def on_batch_end(self, trainer, step):
            seen.append(trainer.model.training)
    _train(EpochPlan(), epochs=2, callbacks=[Spy()], precision=None)
    assert seen and all(seen)


def test_callback_state_is_in_the_trainer_state():
    rec = Recorder()
    t = _train(EpochPlan(), epochs=1, callbacks=[rec])
    st = t.state_dict()
    assert st["callbacks"] == {"recorder": {"n": len(rec.lrs)}}
    rec2 = Recorder()
    t2 = Trainer(bfp.convert(tiny_model(), "ResNet18_FB16"), digits(), TrainConfig(epochs=1, progress=False),
                 callbacks=[rec2], network_config="ResNet18_FB16")
    t2.load_state_dict(st)
    assert rec2.loaded == {"n": len(rec.lrs)} and t2.global_step == t.global_step


def test_bf16_autocast_trains_on_cpu():
    t = Trainer(tiny_model(), digits(), TrainConfig(epochs=1, compute_dtype="bf16", progress=False))
    dtypes = set()
    t.model.conv1.register_forward_hook(lambda mod, inp, out: dtypes.add(out.dtype))
    (m,) = t.fit()
    assert math.isfinite(m["train_loss"]) and not t.amp.scaler.is_enabled()
    assert dtypes == {torch.bfloat16}  # the convolutions ran in bf16, in training and evaluation
    assert all(p.dtype == torch.float32 for p in t.model.parameters())  # master weights stay float32


def test_fp16_uses_a_grad_scaler_starting_at_2_pow_16():
    t = Trainer(tiny_model(), digits(), TrainConfig(epochs=1, compute_dtype="fp16", progress=False))
    assert t.amp.scaler.is_enabled() and t.amp.scaler.get_scale() == 2.0 ** 16


def test_top5_with_fewer_than_five_classes():
    from bfp.engine.trainer import topk_correct
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]])
    top1, top5 = topk_correct(logits, torch.tensor([1, 2]))
    assert top1.item() == 1 and top5.item() == 2


def test_switch_from_fp32_swaps_layers_and_keeps_the_optimizer_on_the_same_parameters():
    seen = {}

    class Types(Callback):
        name = "types"

        def on_epoch_start(self, trainer, epoch):
            seen[epoch] = type(trainer.model.layer1[0].conv1).__name__

    t = _train(EpochPlan.parse({"1": "ResNet18_FB16"}, None, "t"), callbacks=[Types()], precision=None)
    assert seen == {0: "Conv2d", 1: "QConv2d"}
    opt_params = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for p in t.model.parameters()}
    assert t.state_dict()["precision_state"]["layer1.0.conv1"]["fw"]["bits"] == 8


def test_switch_to_null_config_turns_quantization_off():
    seen = {}

    class Bits(Callback):
        name = "bits"

        def on_epoch_start(self, trainer, epoch):
            fw = trainer.model.layer1[0].conv1.precision.fw
            seen[epoch] = fw.bits if fw is not None else None

    t = _train(EpochPlan.parse({"0": "ResNet18_FB16", "1": None}, None, "t"), callbacks=[Bits()])
    assert seen == {0: 8, 1: None} and t.network_config is None
    assert all(v["fw"] is None for v in t.state_dict()["precision_state"].values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_data_gives_the_cpu_loaders_batches():
    on_cpu, on_gpu = digits(), digits(gpu_data=True, device="cuda")
    assert on_gpu.train.dataset.images.is_cuda
    for (a, ya), (b, yb) in zip(on_cpu.train, on_gpu.train):
        assert b.is_cuda and torch.equal(a, b.cpu()) and torch.equal(ya, yb.cpu())
