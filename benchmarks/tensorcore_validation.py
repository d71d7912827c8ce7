"""bfpsim's tensor-core presets against GPUs' own outputs: the hardware vectors that Khattak & Mikaitis
publish with their models (github.com/north-numerical-computing/MATLAB-tensor-core,
``model_validation/<GPU>/<format>/``: operands ``a_*``/``b_*`` as hex float32, one sample of K values
per row; the accumulator ``c_*_fp32`` and the GPU's result ``d_*_fp32`` as float32 bit strings;
``D = A B + C`` with one tensor-core step per sample, K zero-padded to the step's ``terms``).

Not a unit test: the vectors are theirs (BSD-2) and stay in their repository. Unpack its
``model_validation`` folder somewhere (``git archive HEAD model_validation | tar x``) and run::

    python benchmarks/tensorcore_validation.py --data /path/to/model_validation [--limit 500] [--json out.json]

Prints one row per (GPU, input format, preset): samples, bit-exact matches, the first mismatches.
The FP8 rows have C = 0 (the toolbox's H100/H200 FP8 vectors come from WGMMA with a zero D).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bfp.tensorcore import _chain, accumulator_from_name  # noqa: E402

# (GPU folder, input format folder, K per sample, preset, operand_emin)
CASES = [("V100", "fp16", 4, "v100_fp16", None),
         ("A100", "fp16", 8, "a100_fp16", None), ("A100", "bf16", 8, "a100_bf16", None),
         ("A100", "tf32", 4, "a100_tf32", None),
         *[(gpu, f, k, p, e) for gpu in ("H100", "H200") for f, k, p, e in
           (("fp16", 16, "h100_fp16", None), ("bf16", 16, "h100_bf16", None), ("tf32", 4, "h100_tf32", None),
            ("E4M3", 32, "h100_fp8_fast", -6), ("E5M2", 32, "h100_fp8_fast", -14))]]


def _hex(path: Path) -> np.ndarray:
    return np.array([int(h, 16) for h in path.read_text().split()], dtype=np.uint32).view(np.float32)


def _bits(path: Path) -> np.ndarray:
    return np.array([int(w, 2) for w in path.read_text().split()], dtype=np.uint32).view(np.float32)


def validate(root: Path, gpu: str, fmt: str, k: int, preset: str, emin, limit=None) -> dict:
    folder = root / gpu / fmt
    d = _bits(folder / f"d_{gpu}_fp32.txt")
    n = len(d) if limit is None else min(limit, len(d))
    a = _hex(folder / f"a_{gpu}_{fmt}.txt").reshape(-1, k)[:n]
    b = _hex(folder / f"b_{gpu}_{fmt}.txt").reshape(-1, k)[:n]
    fp8 = fmt.startswith("E")
    c = np.zeros(n, np.float32) if fp8 else _bits(folder / f"c_{gpu}_fp32.txt")[:n]
    acc = accumulator_from_name(preset, operand_emin=emin)
    width = -(-k // acc.terms) * acc.terms
    got = np.empty(n, np.float32)
    for j in range(n):  # one step per sample: M = N = 1
        pa = torch.zeros(1, width, dtype=torch.float64)
        pb = torch.zeros(width, 1, dtype=torch.float64)
        pa[0, :k], pb[:k, 0] = torch.from_numpy(a[j].astype(np.float64)), torch.from_numpy(b[j].astype(np.float64))
        got[j] = float(_chain(pa, pb, acc, torch.tensor([[float(c[j])]], dtype=torch.float64)))
    want = d[:n]
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = np.nonzero(~same)[0][:3].tolist()
    return {"gpu": gpu, "format": fmt, "k": k, "preset": preset, "samples": n, "match": int(same.sum()),
            "first_mismatches": [{"sample": i, "ours": float(got[i]), "gpu_result": float(want[i])} for i in bad]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="the toolbox's model_validation folder")
    ap.add_argument("--limit", type=int, default=None, help="samples per case (default: all)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    if not (args.data / "V100").is_dir():
        ap.error(f"--data {args.data}: not a model_validation folder (no V100/ inside)")
    rows = []
    print(f"{'GPU':5} {'input':5} {'K':>3} {'preset':14} {'samples':>7} {'bit-exact':>9}")
    for case in CASES:
        if not (args.data / case[0] / case[1]).is_dir():
            continue
        r = validate(args.data, *case, limit=args.limit)
        rows.append(r)
        print(f"{r['gpu']:5} {r['format']:5} {r['k']:>3} {r['preset']:14} {r['samples']:>7} {r['match']:>9}"
              + (f"  first mismatches: {r['first_mismatches']}" if r["first_mismatches"] else ""), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(json.dumps({"cases": len(rows), "all_bit_exact": all(r["match"] == r["samples"] for r in rows)}))
    return 0 if all(r["match"] == r["samples"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
