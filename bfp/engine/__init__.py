"""Training engine shared by the scripts (cifar.py, later imagenet.py); it knows no flags.

    schedule    cosine learning rate, epoch-keyed precision/optimizer plans (conf_train)
    callbacks   the Callback API (dynamic precision and Slack plug in here)
    checkpoint  atomic save, CRC-verified weights-only load, RNG state
    checkpoint_set  last/best/epoch_NNN written complete or absent; newest intact checkpoint
    ranks       which process writes (rank 0)
    logs        run directory, text log, metrics, TensorBoard
    slack       Slack progress messages (background sender)
    redact      whole-token masking of secrets in what a run writes
    step        one training step (the strategy a Trainer is given)
    trainer     the Trainer
    state_fit   whether a saved model and optimizer state fits the run, entry by entry
    plots       loss/accuracy curves of runs (draw_curve.py)
    skipped_images  the count of unreadable images the loaders skipped, each epoch

Datasets and loaders are ``bfp.data``, one floor down.

The command line that assembles a run from flags is ``bfp.cli``, one floor up.
"""
from .callbacks import Callback, CallbackList
from .checkpoint import CheckpointError
from .schedule import CosineSchedule, EpochPlan
from .step import PlainStep
from .trainer import TrainConfig, Trainer

__all__ = ["Callback", "CallbackList", "CheckpointError", "CosineSchedule", "EpochPlan", "PlainStep",
           "TrainConfig", "Trainer"]
