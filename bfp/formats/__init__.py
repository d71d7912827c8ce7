"""Number formats, one module per family, and the protocol they answer (``base.Format``).

``Float`` (float.py), ``BlockFloat`` (block.py), ``MX`` (mx.py: OCP Microscaling),
``NVFP4`` (nvfp4.py), ``Scaled`` (scaled.py: FP8 with a tensor or row scale) and ``P3109``
(p3109.py: the IEEE P3109 interim report's formats). Each registers its names, dict kind and
config spec with ``base.register_family``; importing this package registers them all.
"""
from .base import (Encoding, Format, Overflow, Rounding, Spec, ValueRange, block_shape, format_from_dict,
                   format_from_name, format_names, kernel_for, register_family, register_kernel, spec_families)
from .float import Float, as_float, float_element, is_float
from .block import BlockFloat
from .mx import INT8, MX, MX_SCALE_MODES
from .nvfp4 import NVFP4
from .scaled import Scaled
from .p3109 import P3109

__all__ = ["BlockFloat", "Encoding", "Float", "Format", "INT8", "MX", "MX_SCALE_MODES", "NVFP4", "Overflow",
           "P3109", "Rounding", "Scaled", "Spec", "ValueRange", "as_float", "block_shape", "float_element", "format_from_dict",
           "format_from_name", "format_names", "is_float", "kernel_for", "register_family", "register_kernel",
           "spec_families"]
