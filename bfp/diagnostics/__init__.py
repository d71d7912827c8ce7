"""Where precision is lost (docs/diagnostics.md).

    points   what rounding does at each quantization point: SQNR, relative error, flushed and
             saturated shares, range use; the measuring hooks; the table and the CSV
    plots    the heat map, a layer's SQNR over training, SQNR against bits
    sweep    one batch's tensors at 2..16 bits of BlockFloat, Float and MX
    shadow   the drift of the quantized model from an FP32 copy (--shadow)
"""
from .plots import heatmap, sqnr_curve, sweep_plot
from .points import (CSV_FIELDS, MEASURES, PointDiagnostics, format_max, measure_step, point_stats, table,
                     write_csv)
from .shadow import SHADOW_MEASURES, Shadow, compare
from .sweep import SWEEP_FAMILIES, capture_step, sweep, sweep_format

__all__ = ["CSV_FIELDS", "MEASURES", "PointDiagnostics", "SHADOW_MEASURES", "SWEEP_FAMILIES", "Shadow",
           "capture_step", "compare", "format_max", "heatmap", "measure_step", "point_stats", "sqnr_curve",
           "sweep", "sweep_format", "sweep_plot", "table", "write_csv"]
