"""Training engine shared by the scripts (cifar.py, later imagenet.py).

    data        datasets and loaders (digits, CIFAR, image folders; on-device augmentation)
    schedule    cosine learning rate, epoch-keyed precision/optimizer plans (conf_train)
    callbacks   the Callback API (dynamic precision, Slack)
    checkpoint  atomic save, weights-only load, RNG state
    logs        run directory, text log, metrics, TensorBoard
    slack       Slack progress messages
    trainer     the Trainer
    plots       loss/accuracy curves of runs (draw_curve.py)
    cli         cifar.py's flags and run setup
"""
from .callbacks import Callback, CallbackList
from .checkpoint import CheckpointError
from .schedule import CosineSchedule, EpochPlan
from .trainer import TrainConfig, Trainer

__all__ = ["Callback", "CallbackList", "CheckpointError", "CosineSchedule", "EpochPlan",
           "TrainConfig", "Trainer"]
