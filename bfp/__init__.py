"""bfpsim: low-precision training simulator for PyTorch.

Layers (each knows only the one below it):

    formats      bfp.formats     Float, BlockFloat, MX, NVFP4, Scaled, P3109 (one module each), format_from_name
    kernels      bfp.kernels     quantize (PyTorch reference, Numba CPU, Numba CUDA)
    layers       bfp.functional, bfp.layers, bfp.accumulate
    conversion   bfp.config, bfp.conversion
    engine       bfp.engine, bfp.models, bfp.dynamic
    scripts      cifar.py, draw_curve.py
"""
from importlib import import_module

from .formats import (MX, NVFP4, P3109, BlockFloat, Encoding, Float, Format, Overflow, Rounding, Scaled,
                      format_from_dict, format_from_name, format_names)
from .kernels import quantize, zero_setting_error
from .precision import POINTS, Accumulator, LayerPrecision, accumulator_from_dict
from . import hadamard, tensorcore  # noqa: F401, E402  (their ops: torch.ops.bfp.hadamard_quantize, fused_bmm)

__version__ = "0.1.0"

# Higher layers load on first use so `import bfp` stays light.
_LAZY = {
    "convert": "bfp.conversion", "conversion_report": "bfp.conversion",
    "precision_state": "bfp.conversion", "load_precision_state": "bfp.conversion",
    "generate_config": "bfp.conversion",
    "ConfigError": "bfp.config", "NetConfig": "bfp.config", "load_config": "bfp.config",
    "QLinear": "bfp.layers", "QConv1d": "bfp.layers", "QConv2d": "bfp.layers",
    "QMatmul": "bfp.layers", "Matmul": "bfp.layers", "QUANTIZED_TYPES": "bfp.layers",
    "accumulate_matmul": "bfp.accumulate", "accumulate_matmul_reference": "bfp.accumulate",
    "DynamicPrecision": "bfp.dynamic",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bfp' has no attribute {name!r}")


__all__ = ["BlockFloat", "Encoding", "Float", "Format", "MX", "NVFP4", "P3109", "Scaled", "Overflow", "Rounding",
           "format_from_dict", "format_from_name", "format_names", "quantize",
           "zero_setting_error", "POINTS", "LayerPrecision", "Accumulator", "accumulator_from_dict", *_LAZY]
