"""The experiment matrices: rows of ``cifar.py`` flags, the setup they share, and their commands.

A row is nothing but flags: ``command(...)`` puts the setup's flags, the
row's flags and the run directory together into the exact ``cifar.py``
command line the runner executes and the report prints, so a reader can copy
one row and get the same numbers (same thread count and seed; see
docs/RESULTS.md, "Rerunning a row").

``cifar10-table`` reproduces the claims of the seeds:

* seed 000 (FlexBlock BFP): FB24/FB16 train about as well as FP32, FB12 and
  FB12LG16 lose accuracy, ``--do Simple/0.6/0.8/0/1`` recovers some of it
  with fewer bits;
* seed 001 (CPD): 8 workers reducing 8-bit (e4m3) and 4-bit (e3m0)
  gradients lose accuracy without APS and recover with it; Kahan and LARS;
  the all-reduce orders (the default is gloo's, the CPU backend's, on DDP's buckets;
  then NCCL's ring and tree, CPD's sequential and bfpsim's per-parameter ring);
* seeds 002-004 (mixed precision): simulated fp16 gradients without loss
  scaling underflow, dynamic loss scaling mends it, bf16 needs none;
* and today's 8/4-bit formats (FP8 hybrid, MXFP8, MXFP4) beside them.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Optional

from .spread import seed_key


@dataclass(frozen=True)
class Row:
    name: str            # file and run-directory name
    claim: str           # the panel it belongs to (CLAIMS)
    words: str           # the format in words, for the table
    flags: tuple[str, ...]
    ref: str = ""        # the row it compares with, where not its panel's (below)

    @property
    def reference(self) -> str:
        """The row its verdicts and deltas compare with: ``ref`` where given, else 8-worker FP32 for
        the all-reduce panel and FP32 for the others."""
        return self.ref or ("w8-fp32" if self.claim == "seed001" else "fp32")


@dataclass(frozen=True)
class Profile:
    """The setup every row of a table shares."""

    name: str
    about: str
    flags: tuple[str, ...]
    epochs: int
    rows: Optional[tuple[str, ...]] = None   # None: every row of the table
    threads: int = 2
    seeds: tuple[int, ...] = (0,)  # seed 0 for every row; the others for references and close rows
    script: str = "cifar.py"       # the task script the rows run
    data_flag: Optional[str] = "-dp"  # how the script takes --data; None: its embedded data (lm.py)


CLAIMS = {
    "seed000": "Seed 000, block floating point (FlexBlock)",
    "seed001": "Seed 001, low-precision gradient all-reduce over 8 workers (CPD)",
    "seed002": "Seeds 002-004, mixed precision and loss scaling",
    "formats": "Today's 8- and 4-bit formats",
}

W8 = ("--emulate-node", "8")
ROWS = (
    Row("fp32", "seed000", "FP32 (reference)", ()),
    Row("fb24", "seed000", "BFP 16-bit mantissas, groups of 24 (FB24)", ("--bfp", "any_FB24")),
    Row("fb16", "seed000", "BFP 8-bit, groups of 12 (FB16)", ("--bfp", "any_FB16")),
    Row("fb12lg16", "seed000", "BFP 4-bit forward/weight-grad, 8-bit input-grad (FB12LG16)",
        ("--bfp", "any_FB12LG16")),
    Row("fb12", "seed000", "BFP 4-bit, groups of 24 (FB12)", ("--bfp", "any_FB12")),
    Row("fb16-do", "seed000", "FB16 with dynamic precision Simple/0.6/0.8/0/1 (4/8/16 bits)",
        ("--bfp", "any_FB16", "--do", "Simple/0.6/0.8/0/1", "--do-every", "100")),
    Row("w8-fp32", "seed001", "8 workers, FP32 all-reduce", W8),
    Row("w8-e4m3", "seed001", "8 workers, gradients e4m3 (8-bit), no APS",
        W8 + ("--grad-exp", "4", "--grad-man", "3")),
    Row("w8-e4m3-aps", "seed001", "8 workers, gradients e4m3, APS",
        W8 + ("--grad-exp", "4", "--grad-man", "3", "--use-aps")),
    Row("w8-e3m0", "seed001", "8 workers, gradients e3m0 (4-bit), no APS",
        W8 + ("--grad-exp", "3", "--grad-man", "0")),
    Row("w8-e3m0-aps", "seed001", "8 workers, gradients e3m0, APS",
        W8 + ("--grad-exp", "3", "--grad-man", "0", "--use-aps")),
    Row("w8-e4m3-aps-kahan", "seed001", "8 workers, gradients e4m3, APS + Kahan",
        W8 + ("--grad-exp", "4", "--grad-man", "3", "--use-aps", "--use-kahan")),
    Row("w8-e4m3-aps-lars", "seed001", "8 workers, gradients e4m3, APS + LARS",
        W8 + ("--grad-exp", "4", "--grad-man", "3", "--use-aps", "--use-lars")),
    # the order the sums are added in (bfp.distributed.orders): does it matter? The rows above
    # use the default, the CPU backend's (gloo) on DDP's buckets; these the other orders
    *(Row(f"w8-{fmt}{'-aps' if aps else ''}-{order}", "seed001",
          f"8 workers, gradients {fmt}{', APS' if aps else ''}, {order} order",
          W8 + ("--grad-exp", fmt[1], "--grad-man", fmt[3], "--grad-order", order)
          + (("--use-aps",) if aps else ()) + (("--nodes", "2") if order == "nccl-tree" else ()))
      for fmt, aps in (("e4m3", False), ("e3m0", True))
      for order in ("nccl-ring", "nccl-tree", "sequential", "param-ring")),
    Row("fp16grad", "seed002", "simulated fp16 gradients (Float(5,10) at bwo/bio/bwg/big), no loss scaling",
        ("--bfp", "any_fp16_grads", "--loss-scale", "none")),
    Row("fp16grad-ls", "seed002", "simulated fp16 gradients, dynamic loss scaling",
        ("--bfp", "any_fp16_grads", "--loss-scale", "dynamic")),
    Row("bf16", "seed002", "bf16 autocast (torch), no loss scaling", ("--precision", "bf16")),
    Row("fp8", "formats", "FP8: e4m3 weights/activations, e5m2 gradients", ("--bfp", "any_fp8_hybrid")),
    Row("mxfp8", "formats", "OCP MXFP8 (E4M3/E5M2 elements, E8M0 scale per 32)", ("--bfp", "any_mxfp8")),
    Row("mxfp4", "formats", "OCP MXFP4 (E2M1 elements, E8M0 scale per 32)", ("--bfp", "any_mxfp4")),
    Row("mxfp8-rceil", "formats", "MXFP8 with the RCEIL scale (NVIDIA's MXFP8 recipe)",
        ("--bfp", "any_mxfp8_rceil")),
    Row("nvfp4", "formats", "NVFP4 (E2M1, E4M3 scale per 16, FP32 tensor scale)", ("--bfp", "any_nvfp4")),
    Row("nvfp4-recipe", "formats",
        "NVFP4 recipe: 16x16 weight blocks, stochastic gradients (Hadamard: Linear only, none quantized here)",
        ("--bfp", "any_nvfp4_recipe")),
    Row("fp8-tensorwise", "formats", "FP8 current scaling (per-tensor amax; e4m3 forward, e5m2 gradients)",
        ("--bfp", "any_fp8_tensorwise")),
    Row("fp8-delayed", "formats", "FP8 delayed scaling (amax history of 16; e4m3 forward, e5m2 gradients)",
        ("--bfp", "any_fp8_delayed")),
    Row("nvfp4-te", "formats", "NVFP4 in TransformerEngine's convention (block scales without a lower clamp)",
        ("--bfp", "any_nvfp4_te")),
    Row("fp8-h100-fast", "formats", "FP8 (e4m3/e5m2) with H100 fast accumulation in every GEMM (tensor-core model)",
        ("--bfp", "any_fp8_h100")),
    Row("fp8-h100-promoted", "formats", "FP8 with H100 accumulation promoted to FP32 every 128 (DeepSeek-V3's fix)",
        ("--bfp", "any_fp8_h100_promoted")),
    Row("p3109-p3", "formats", "IEEE P3109 binary8p3 (p3109_k8p3se) at every operand, no scaling",
        ("--bfp", "any_p3109_p3")),
    Row("p3109-p4", "formats", "IEEE P3109 binary8p4 (p3109_k8p4se) at every operand, no scaling",
        ("--bfp", "any_p3109_p4")),
)

_SETUP = ("-m", "ResNet10", "--model-opt", "width=16", "-d", "CIFAR10", "--gpu-data", "True",
          "--batch-size-train", "128", "--optim-lr", "0.1", "--optim-momentum", "0.9",
          "--optim-weight-decay", "5e-4", "--seed", "0")
PROFILES = {
    "full": Profile(
        "full", "full CIFAR-10 (50,000 train / 10,000 test), ResNet10 width 16 (0.3M parameters), "
                "3 epochs, batch 128, SGD lr 0.1 momentum 0.9 wd 5e-4 with cosine decay to 0 per step, "
                "crop+flip augmentation, seed 0 (and 1, 2 for the references and the rows near a threshold), "
                "2 threads", _SETUP, epochs=3, seeds=(0, 1, 2)),
    "quick": Profile(
        "quick", "machinery check only (CI): 300 train / 100 test images, ResNet10 width 4, 1 epoch, "
                 "three rows; its accuracies mean nothing",
        ("-m", "ResNet10", "--model-opt", "width=4", "-d", "CIFAR10", "--gpu-data", "True",
         "--batch-size-train", "32", "--optim-lr", "0.05", "--seed", "0",
         "--limit-train-images", "300", "--limit-test-images", "100"),
        epochs=1, rows=("fp32", "fb16-do", "w8-e4m3-aps"), threads=1),
}
# The transformer tables (docs/transformers.md renders from them): the same formats on a ViT
# (cifar.py -m ViT) and on lm.py's character-level GPT (bits per character).
TRANSFORMER_ROWS = (
    ("fp32", "FP32 (reference)", ()),
    ("mxfp8", "OCP MXFP8 on every GEMM operand (attention products included)", ("--bfp", "any_mxfp8")),
    ("fp8", "FP8 e4m3 on every GEMM operand, no loss scaling", ("--bfp", "any_fp8_e4m3")),
    ("fp8-ls", "FP8 e4m3 on every GEMM operand, dynamic loss scaling",
     ("--bfp", "any_fp8_e4m3", "--loss-scale", "dynamic")),
    ("nvfp4", "NVFP4 (E2M1, E4M3 scale per 16, FP32 tensor scale)", ("--bfp", "any_nvfp4")),
    # H100 FP8 accumulation where the GEMMs are long: fast (one chain over K) and promoted every 128
    ("fp8-h100-fast", "FP8 (e4m3/e5m2) with H100 fast accumulation in every GEMM (tensor-core model)",
     ("--bfp", "any_fp8_h100")),
    ("fp8-h100-promoted", "FP8 with H100 accumulation promoted to FP32 every 128 (DeepSeek-V3's fix)",
     ("--bfp", "any_fp8_h100_promoted")),
)
VIT_ROWS = tuple(Row(n, "vit", w, f) for n, w, f in TRANSFORMER_ROWS)
# Hugging Face transformers' GPT-2 of the same size (lm.py -m HFGPT2: random init, dropout 0), FP32 and
# MXFP8: the conversion of a real Hugging Face model (Conv1D projections, SDPA) in training.
LM_ROWS = tuple(Row(n, "lm", w, f) for n, w, f in TRANSFORMER_ROWS) + (
    Row("hf-gpt2", "lm", "Hugging Face GPT-2 (transformers' GPT2LMHeadModel, the same sizes), FP32", ("-m", "HFGPT2")),
    Row("hf-gpt2-mxfp8", "lm", "Hugging Face GPT-2, OCP MXFP8 on every GEMM operand", ("-m", "HFGPT2", "--bfp",
                                                                                       "any_mxfp8"), ref="hf-gpt2"))
_VIT = ("-m", "ViT", "--model-opt", "dim=64", "--model-opt", "depth=4", "--model-opt", "heads=2", "-d", "CIFAR10",
        "--gpu-data", "True", "--batch-size-train", "128", "--optimizer", "adamw", "--optim-lr", "0.001",
        "--optim-weight-decay", "0.05", "--seed", "0")
_LM = ("--seed", "0")
TABLE_PROFILES = {
    "cifar10-table": PROFILES,
    "vit-table": {
        "full": Profile("full", "full CIFAR-10, ViT dim 64, depth 4, 2 heads, patch 4, 3 epochs, batch 128, AdamW "
                                "lr 1e-3 wd 0.05 with cosine decay, crop+flip augmentation, seed 0, 2 threads",
                        _VIT, epochs=3),
        "quick": Profile("quick", "machinery check only: 256 train / 100 test images, 1 epoch, two rows",
                         _VIT + ("--limit-train-images", "256", "--limit-test-images", "100"), epochs=1,
                         rows=("fp32", "mxfp8"), threads=1)},
    "lm-table": {
        "full": Profile("full", "lm.py's defaults: GPT dim 128, depth 4, 4 heads, block 64, batch 128, AdamW lr "
                                "3e-3 wd 0.01 with cosine decay, on the Python standard-library corpus (offline), 5 "
                                "epochs, seed 0, 2 threads", _LM, epochs=5, script="lm.py", data_flag=None),
        "quick": Profile("quick", "machinery check only: 256 train / 64 test windows, 1 epoch, two rows",
                         _LM + ("--limit-train-images", "256", "--limit-test-images", "64"), epochs=1,
                         rows=("fp32", "mxfp8"), threads=1, script="lm.py", data_flag=None)},
}
TABLES = {"cifar10-table": ROWS, "vit-table": VIT_ROWS, "lm-table": LM_ROWS}


def table(name: str) -> tuple[Row, ...]:
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; allowed: {', '.join(TABLES)}")
    return TABLES[name]


def profile(name: str, table_name: str = "cifar10-table") -> Profile:
    profiles = TABLE_PROFILES[table(table_name) and table_name]
    if name not in profiles:
        raise ValueError(f"unknown profile {name!r}; allowed: {', '.join(profiles)}")
    return profiles[name]


def select(rows: tuple[Row, ...], prof: Profile, wanted: Optional[list[str]] = None) -> list[Row]:
    """The rows to run: ``wanted`` (names, in the table's order) or the profile's rows."""
    names = [r.name for r in rows]
    pick = wanted if wanted else (prof.rows or names)
    bad = [n for n in pick if n not in names]
    if bad:
        raise ValueError(f"unknown row(s) {', '.join(bad)}; allowed: {', '.join(names)}")
    return [r for r in rows if r.name in pick]


def key(row: Row, seed: int = 0) -> str:
    """The result file's and run directory's name of ``row`` with ``seed`` (``spread.seed_key``)."""
    return seed_key(row.name, seed)


def base_name(key_: str) -> str:
    """The row name of a result key (``key``'s inverse: ``fb16-s2`` -> ``fb16``)."""
    return re.sub(r"-s\d+$", "", key_)


def _with_seed(flags: tuple[str, ...], seed: int) -> list[str]:
    out = list(flags)
    if "--seed" in out[:-1]:
        out[out.index("--seed") + 1] = str(seed)
    else:
        out += ["--seed", str(seed)]
    return out


def command(row: Row, prof: Profile, data: str, run_dir: str, epochs: Optional[int] = None,
            seed: int = 0) -> list[str]:
    """The command line (argv, the script first: ``cifar.py``, or ``lm.py`` for the LM table) of
    ``row`` under ``prof`` (with ``--seed seed``; the profile's flags carry seed 0)."""
    data_args = [prof.data_flag, data] if prof.data_flag else []
    return ([prof.script, *(_with_seed(prof.flags, seed) if seed else prof.flags), *data_args,
             "--training-epochs", str(epochs or prof.epochs), "--threads", str(prof.threads), *row.flags,
             "--progress", "False", "--log", "True", "--save", "True", "--run-dir", run_dir,
             "--run-name", key(row, seed)])


def shell(argv: list[str]) -> str:
    return "python " + " ".join(shlex.quote(a) for a in argv)
