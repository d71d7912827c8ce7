"""Dynamic precision control: change BlockFloat bits during training from the
zero-setting error (ZSE) each layer's quantization produces.

One idea per module, each usable alone (each imports only those above it):

``spec``
    ``SimpleSpec`` / ``parse_spec``: the
    ``--do Simple/LOWER/UPPER/INITIAL/HOLD[/EVERY][/LADDER]`` grammar
    (``docs/dynamic.md``), ``ladder_step`` and ``pair_name``.
``controller``
    ``SimpleController``: the decision rule on plain numbers: given a ZSE and
    the current bits of each (layer, linked pair), the new bits. Its state is
    a decision index and hold timers.
``meter``
    ``ZseMeter``: measures ZSE through the Q-layers' ``quantize_hook`` (counts
    come out of the quantization kernel and are summed on the tensor's
    device; the host reads them once per decision, summed over processes
    under ``torch.distributed``).
``report``
    The CSV log ``dynamic_precision.csv`` (``read_log``), the console table
    (``format_table``), ``plot_precision(run_dir)`` drawing each layer's bits
    over training, and ``main``: ``python -m bfp.dynamic plot RUN_DIR``.
``callback``
    ``DynamicPrecision``: a training callback that has the meter measure,
    asks the controller, swaps the layers' formats, and logs every decision
    to TensorBoard, the CSV in the run folder and the console.
"""
from .callback import DynamicPrecision
from .controller import SimpleController
from .report import CSV_FIELDS, CSV_NAME, format_table, main, plot_precision, read_log
from .spec import DEFAULT_LADDER, DEFAULT_SAMPLE, SimpleSpec, ladder_step, pair_name, parse_spec

__all__ = ["SimpleSpec", "parse_spec", "SimpleController", "DynamicPrecision", "ladder_step",
           "pair_name", "format_table", "read_log", "plot_precision", "CSV_NAME", "CSV_FIELDS",
           "DEFAULT_LADDER", "DEFAULT_SAMPLE", "main"]
