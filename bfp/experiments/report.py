"""docs/RESULTS.md and its curves from a matrix's result files.

``render`` writes one table (row, format in words, final/best top-1, delta to
FP32, training-time ratio to FP32, notes), one PNG per claim (test top-1 and
train loss per epoch), and a verdict per seed claim computed from the
numbers with the thresholds in ``TOL`` (stated in the page), so the text can
never disagree with the table. Rows without a result are listed with the
command that produces them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from . import matrix

TOL = 1.0   # points of top-1: closer than this counts as "about as well"; farther as a loss or a gain


def _top1(res: dict, name: str) -> Optional[float]:
    return res[name]["final_top1"] if name in res else None


def _fmt(v: Optional[float], spec: str = ".2f", unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{spec}}{unit}"


def _notes(doc: dict) -> str:
    out = []
    if doc.get("mean_bits") is not None:
        out.append(f"mean bits {doc['mean_bits']:.2f}")
    if doc.get("skipped_steps") is not None:
        out.append(f"{doc['skipped_steps']} skipped steps")
    if doc.get("resumed"):
        out.append("resumed")
    return ", ".join(out)


def table_lines(res: dict[str, dict], rows: tuple[matrix.Row, ...]) -> list[str]:
    ref = res.get("fp32")
    lines = ["| row | format | top-1 final | top-1 best | Δ to FP32 | time / FP32 | notes |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        d = res.get(r.name)
        if d is None:
            lines.append(f"| `{r.name}` | {r.words} | not run yet | | | | |")
            continue
        delta = d["final_top1"] - ref["final_top1"] if ref else None
        ratio = d["train_time_s"] / ref["train_time_s"] if ref and ref["train_time_s"] else None
        mark = "" if d.get("citable") else " †"  # not from one clean commit
        lines.append(f"| `{r.name}`{mark} | {r.words} | {d['final_top1']:.2f}% | {d['best_top1']:.2f}% | "
                     f"{_fmt(delta, '+.2f')} | {_fmt(ratio, '.2f', 'x')} | {_notes(d)} |")
    if any(not d.get("citable") for d in res.values()):
        lines += ["", "†: not citable: run from a source tree with uncommitted changes, or over several commits "
                      "(rerun it from one clean commit: `python -m bfp.experiments run` refuses a dirty tree)."]
    return lines


def _near(a: Optional[float], b: Optional[float]) -> Optional[bool]:
    """``a`` within TOL points of ``b``; None when either is missing."""
    return None if a is None or b is None else abs(a - b) <= TOL


def _below(a: Optional[float], b: Optional[float]) -> Optional[bool]:
    """``a`` more than TOL points under ``b``; None when either is missing."""
    return None if a is None or b is None else a < b - TOL


def _both(x: Optional[bool], y: Optional[bool]) -> Optional[bool]:
    return None if x is None or y is None else x and y


def _verdict(checks: list[Optional[bool]]) -> str:
    known = [c for c in checks if c is not None]
    if not known:
        return "not run yet"
    if len(known) < len(checks):
        return "partly run"
    return "reproduced" if all(known) else ("partly reproduced" if any(known) else "not reproduced")


def claims(res: dict[str, dict]) -> dict[str, tuple[str, str]]:
    """Per claim: (verdict, sentences with the numbers)."""
    t = {r.name: _top1(res, r.name) for r in matrix.ROWS}
    p = lambda n: "n/a" if t[n] is None else f"{t[n]:.2f}%"   # noqa: E731
    out = {}
    bits = res.get("fb16-do", {}).get("mean_bits")
    c = [_near(t["fb24"], t["fp32"]), _near(t["fb16"], t["fp32"]), _below(t["fb12"], t["fp32"]),
         _below(t["fb12lg16"], t["fp32"]),
         _both(None if bits is None else bits < 8, None if None in (t["fb16-do"], t["fb12"])
               else t["fb16-do"] > t["fb12"])]
    out["seed000"] = (_verdict(c), (
        f"FP32 {p('fp32')}, FB24 {p('fb24')}, FB16 {p('fb16')}: FB24/FB16 within {TOL:g} point of FP32: "
        f"{_yn(c[0])}/{_yn(c[1])}. Narrower blocks lose more than {TOL:g} point: FB12 {p('fb12')} "
        f"({_yn(c[2])}), FB12LG16 {p('fb12lg16')} ({_yn(c[3])}). FB16 with `--do Simple/0.6/0.8/0/1` "
        f"reaches {p('fb16-do')} on {_fmt(bits)} mean bits (FB16: 8, FB12: 4); fewer bits than FB16 and "
        f"above FB12: {_yn(c[4])}."))
    c = [_both(_below(t[no], t["w8-fp32"]), _below(t[no], t[yes]))
         for no, yes in (("w8-e4m3", "w8-e4m3-aps"), ("w8-e3m0", "w8-e3m0-aps"))]
    out["seed001"] = (_verdict(c), (
        f"8 workers, FP32 all-reduce {p('w8-fp32')}. e4m3 gradients: {p('w8-e4m3')} without APS, "
        f"{p('w8-e4m3-aps')} with (loses without APS and recovers with it: {_yn(c[0])}). e3m0 gradients: "
        f"{p('w8-e3m0')} without APS, {p('w8-e3m0-aps')} with ({_yn(c[1])}). e4m3+APS with Kahan "
        f"{p('w8-e4m3-aps-kahan')}, with LARS {p('w8-e4m3-aps-lars')}."))
    sk = res.get("fp16grad-ls", {}).get("skipped_steps")
    c = [_below(t["fp16grad"], t["fp32"]), _near(t["fp16grad-ls"], t["fp32"]), _near(t["bf16"], t["fp32"])]
    out["seed002"] = (_verdict(c), (
        f"Simulated fp16 gradients without loss scaling {p('fp16grad')} against FP32 {p('fp32')} "
        f"(degrades by more than {TOL:g} point: {_yn(c[0])}); with dynamic loss scaling "
        f"{p('fp16grad-ls')} ({'n/a' if sk is None else sk} skipped steps; about FP32: "
        f"{_yn(c[1])}); bf16 autocast without scaling {p('bf16')} (about FP32: {_yn(c[2])})."))
    out["formats"] = ("measured", (
        f"FP8 (e4m3/e5m2) {p('fp8')}, MXFP8 {p('mxfp8')} (RCEIL scale: {p('mxfp8-rceil')}), MXFP4 {p('mxfp4')}, "
        f"NVFP4 {p('nvfp4')}, against FP32 {p('fp32')}."))
    return out


def _yn(v: Optional[bool]) -> str:
    return "n/a" if v is None else ("yes" if v else "no")


def plot_claim(res: dict[str, dict], rows: list[matrix.Row], title: str, out: Path) -> Optional[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    have = [r for r in rows if r.name in res]
    if not have:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in have:
        ep = res[r.name]["epochs"]
        x = [e["epoch"] + 1 for e in ep]
        style = dict(marker="o", lw=1.5, ls="--" if r.name in ("fp32", "w8-fp32") else "-")
        a1.plot(x, [e["test_acc1"] for e in ep], label=r.name, **style)
        a2.plot(x, [e["train_loss"] for e in ep], label=r.name, **style)
    a1.set(xlabel="epoch", ylabel="test top-1 (%)", title="test top-1")
    a2.set(xlabel="epoch", ylabel="train loss", title="train loss", yscale="log")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.xaxis.get_major_locator().set_params(integer=True)
    a1.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def render(table: str, res: dict[str, dict], rows: tuple[matrix.Row, ...], doc: Path, img: Path,
           source: str = "") -> Path:
    """Write ``doc`` (Markdown) and its PNGs under ``img`` from ``res`` (the result files of
    folder ``source``, by row name); returns ``doc``."""
    any_doc = next(iter(res.values()), None)
    lines = [f"# Results: `{table}`", "",
             "Generated by `python -m bfp.experiments report " + table + "` from the result files in "
             f"`{source or 'results/' + table}/`; do not edit by hand. Every row is one `cifar.py` command (below), "
             "run by `python -m bfp.experiments run " + table + " --data DIR`.", ""]
    if any_doc:
        m, v = any_doc["machine"], any_doc["versions"]
        commits = sorted({(d.get("git_commit") or "unknown")[:12] + ("+" if "+dirty" in (d.get("git_commit") or "")
                                                                     else "") for d in res.values()})
        lines += ["## Setup", "", f"{any_doc['setup']}.", "",
                  f"Machine: {m.get('cpu')} ({m.get('cores')} cores), {m.get('platform')}; Python "
                  f"{m.get('python')}, torch {v.get('torch')}, numba {v.get('numba')}, numpy {v.get('numpy')}; "
                  f"threads {any_doc['threads']}, seed {any_doc['seed']}; bfpsim commit(s) "
                  f"{', '.join(commits)} (each row's commit when it started; `+`: with uncommitted changes). "
                  "Times are training-epoch times on a shared 2-core machine (load averages are in each result "
                  "file), so their ratios are rough.", ""]
    lines += ["## Table", "", *table_lines(res, rows), "",
              f"Δ: final top-1 minus FP32's, in points. Claims below compare final top-1 with a tolerance of "
              f"{TOL:g} point (one seed, so differences under about a point are noise).", ""]
    verdicts = claims(res)
    lines += ["## The seeds' claims", ""]
    for key, title in matrix.CLAIMS.items():
        group = [r for r in rows if r.claim == key]
        png = plot_claim(res, group, title, img / f"{table}-{key}.png")
        verdict, text = verdicts[key]
        lines += [f"### {title}: {verdict}", "", text, ""]
        if png is not None:
            rel = Path("img") / png.name if doc.parent == img.parent else png
            lines += [f"![{title}]({rel.as_posix()})", ""]
    lines += ["## Rerunning a row", "",
              "Copy a row's command (run from the repository root, with the JPEG CIFAR-10 unpacked in "
              "`data/cifar10_jpg`, e.g. by `python -m bfp.experiments run ... --data "
              "../shared/data/cifar10-jpg.tar.gz`, or made from the CIFAR-10 site's archive by "
              "`python -m bfp.data prepare cifar10 --from cifar-10-python.tar.gz --out data/cifar10_jpg`). "
              "With the same thread count (`--threads 2`), seed, "
              "machine type and package versions, it reproduces the recorded per-epoch losses and "
              "accuracies exactly; `python -m bfp.experiments verify " + table + " --row NAME --data DIR` "
              "reruns a row into a scratch folder and compares every epoch's numbers with its result file. "
              "Another thread count or CPU changes the order of float additions inside torch's kernels, "
              "so the last bits (and then the curves) can differ.", ""]
    for r in rows:
        d = res.get(r.name)
        cmd = matrix.shell(d["command"]) if d else "(not run yet)"
        lines += [f"- `{r.name}`: `{cmd}`"]
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(lines) + "\n")
    return doc
