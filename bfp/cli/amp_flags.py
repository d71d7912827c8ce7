"""The loss-scaling and gradient-histogram flags, and the objects a run builds from them.

``add_amp_flags(parser)`` adds the "mixed precision" group (one call in
``build_parser``); ``make_amp`` turns the flags into the run's
``bfp.amp.MixedPrecision`` (every value is checked by argparse, so a bad one
exits with status 2 and names what is allowed); ``amp_callbacks`` gives the loss-scale log and the
gradient histogram callbacks the flags ask for.
"""
from __future__ import annotations

import argparse

from ..amp import (BACKOFF_FACTOR, GROWTH_FACTOR, GROWTH_INTERVAL, INIT_SCALE, SCALER_PARAMS, MixedPrecision,
                   parse_loss_scale)
from ..engine.amp_log import LossScaleLog
from ..engine.grad_histogram import GradHistogram
from .param_flags import as_flags


def _loss_scale(v: str):
    try:
        return parse_loss_scale(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(as_flags(str(e), {"loss_scale"})) from None


def _checked(convert, ok, allowed: str):
    """An argparse type: ``convert`` the text, then require ``ok(value)`` (else exit 2 naming ``allowed``)."""
    def parse(text: str):
        try:
            v = convert(text)
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"{text!r}: allowed {allowed}")
        return v
    return parse


def _scaler_param(key: str, convert):
    """An argparse type checking a ``LossScaler`` parameter as the scaler does (``SCALER_PARAMS``)."""
    ok, allowed = SCALER_PARAMS[key]
    return _checked(convert, ok, allowed)


def add_amp_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mixed precision: loss scaling and gradient histograms (bfp.amp)")
    g.add_argument("--loss-scale", type=_loss_scale, default=None, metavar="none|S|dynamic",
                   help="loss scaling: none; a static scale S (e.g. 1024); dynamic (skip a step and back off "
                        "on overflow, grow after --loss-scale-interval clean steps). Overflow includes a "
                        "simulated gradient format (bio/bwo/big/bwg of --bfp) that would saturate. "
                        "Default: dynamic with --precision fp16, none otherwise")
    g.add_argument("--loss-scale-init", type=_scaler_param("init_scale", float),
                   default=INIT_SCALE, help="dynamic: initial scale")
    g.add_argument("--loss-scale-growth", type=_scaler_param("growth_factor", float),
                   default=GROWTH_FACTOR, help="dynamic: growth factor")
    g.add_argument("--loss-scale-backoff", type=_scaler_param("backoff_factor", float),
                   default=BACKOFF_FACTOR, help="dynamic: backoff factor")
    g.add_argument("--loss-scale-interval", type=_scaler_param("growth_interval", int),
                   default=GROWTH_INTERVAL, help="dynamic: clean steps in a row before the scale grows")
    g.add_argument("--grad-histogram", type=_checked(int, lambda v: v >= 0, "an integer >= 0 (0: off)"),
                   default=0, metavar="N",
                   help="every N steps, histogram log2|dy| of each layer's activation gradients with its "
                        "format's and fp16's range marked: TensorBoard (--log) and "
                        "grad_histograms/epoch_<n>.png in the run directory (0: off)")


def make_amp(args: argparse.Namespace, compute_dtype: str, device_type: str) -> MixedPrecision:
    """The run's policy; the flags' values were checked when they were parsed."""
    return MixedPrecision(compute_dtype, device_type, loss_scale=args.loss_scale,
                          init_scale=args.loss_scale_init, growth_factor=args.loss_scale_growth,
                          backoff_factor=args.loss_scale_backoff, growth_interval=args.loss_scale_interval)


def amp_callbacks(args: argparse.Namespace) -> list:
    """The loss-scale log (inert without scaling) and, with ``--grad-histogram N``, the histogram."""
    callbacks = [LossScaleLog()]
    if args.grad_histogram:
        callbacks.append(GradHistogram(args.grad_histogram))
    return callbacks
