"""Callback: how many unreadable images the data loaders skipped each epoch (``bfp.data.images``)."""
from __future__ import annotations

from ..data.images import SkippingLoader
from .callbacks import Callback


class SkippedImagesReport(Callback):
    """Logs, after each epoch, how many training and test images were skipped as unreadable."""

    name = "skipped_images"

    def __init__(self, loaders: dict[str, SkippingLoader]):
        self.loaders = loaders

    def on_epoch_end(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        for split, loader in self.loaders.items():
            if loader.skipped_this_epoch:
                metrics[f"{split}_skipped_images"] = float(loader.skipped_this_epoch)
                trainer.log(f"epoch {epoch + 1}: skipped {loader.skipped_this_epoch} unreadable {split} "
                            f"image(s): {', '.join(sorted(loader.skipped))}")


def report_callbacks(data) -> list[Callback]:
    """A ``SkippedImagesReport`` for a ``DataBundle`` whose loaders skip images, else nothing."""
    loaders = {s: getattr(data, s) for s in ("train", "test") if isinstance(getattr(data, s), SkippingLoader)}
    return [SkippedImagesReport(loaders)] if loaders else []
