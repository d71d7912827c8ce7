"""docs/RESULTS.md and its curves from a matrix's result files.

``render`` writes one table (row, format in words, final/best top-1, delta to
FP32, training-time ratio to FP32, notes), one PNG per claim (test top-1 and
train loss per epoch), and a verdict per seed claim computed from the
numbers with the thresholds in ``TOL`` (stated in the page), so the text can
never disagree with the table. Rows without a result are listed with the
command that produces them.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from . import matrix, reruns, results

from .spread import (MARGIN, TOL, below, both, near, reference_too_noisy, summary, top1s, verdict,
                     yes_no)


def _fmt(v: Optional[float], spec: str = ".2f", unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{spec}}{unit}"


def _notes(doc: dict) -> str:
    out = []
    if doc.get("mean_bits") is not None:
        out.append(f"mean bits {doc['mean_bits']:.2f}")
    if doc.get("skipped_steps") is not None:
        out.append(f"{doc['skipped_steps']} skipped steps")
    if results.resumed(doc.get("invocations")):
        out.append("resumed")
    return ", ".join(out)


def _seeds_cell(values: list[float]) -> str:
    if len(values) < 2:
        return "1 seed"
    m, lo, hi = summary(values)
    return f"{m:.2f}% [{lo:.2f}, {hi:.2f}] ({len(values)} seeds)"


def table_lines(res: dict[str, dict], rows: tuple[matrix.Row, ...], verified: list[dict] = ()) -> list[str]:
    """The table's Markdown lines; a row's time is over FP32's on the row's own host
    (``reruns.time_on``), or over FP32's own run, marked ‡, where FP32 was never timed there."""
    lines = ["| row | format | top-1 final (seed 0) | seeds: mean [min, max] | top-1 best | Δ to reference "
             "(means) | time / FP32 | notes |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    fp32, any_far = res.get("fp32"), False
    for r in rows:
        d = res.get(r.name)
        if d is None:
            lines.append(f"| `{r.name}` | {r.words} | not run yet | | | | | |")
            continue
        mine, ref = top1s(res, r.name), top1s(res, r.reference)
        delta = summary(mine)[0] - summary(ref)[0] if ref and r.name != r.reference else None
        base = reruns.time_on(res, list(verified), "fp32", reruns.host(d))
        other = base is None and fp32 is not None
        base = fp32["train_time_s"] if other else base
        ratio = d["train_time_s"] / base if base else None
        far = other and ratio is not None
        any_far = any_far or far
        mark = "" if d.get("citable") else " †"  # not from one clean commit
        lines.append(f"| `{r.name}`{mark} | {r.words} | {d['final_top1']:.2f}% | {_seeds_cell(mine)} | "
                     f"{d['best_top1']:.2f}% | {_fmt(delta, '+.2f')}{'' if delta is None else f' ({r.reference})'} | "
                     f"{_fmt(ratio, '.2f', 'x')}{' ‡' if far else ''} | {_notes(d)} |")
    if any(not d.get("citable") for d in res.values()):
        lines += ["", "†: not citable: run from a source tree with uncommitted changes, or over several commits "
                      "(rerun it from one clean commit: `python -m bfp.experiments run` refuses a dirty tree)."]
    if any_far:
        lines += ["", "‡: over FP32's time on another host (FP32 was not timed on this row's host; a `verify "
                      "--row fp32` there times it), so the ratio carries the hosts' speed difference."]
    return lines


def claims(res: dict[str, dict]) -> dict[str, tuple[str, str]]:
    """Per claim: (verdict, sentences with the numbers); comparisons use every seed (``spread``)."""
    t = {r.name: top1s(res, r.name) for r in matrix.ROWS}

    def p(n: str) -> str:
        m = summary(t[n])
        if m is None:
            return "n/a"
        return f"{m[0]:.2f}%" + (f" [{m[1]:.2f}, {m[2]:.2f}]" if len(t[n]) > 1 else "")
    out = {}
    bits = res.get("fb16-do", {}).get("mean_bits")
    c = [near(t["fb24"], t["fp32"]), near(t["fb16"], t["fp32"]), below(t["fb12"], t["fp32"]),
         below(t["fb12lg16"], t["fp32"]),
         both(None if bits is None else bits < 8, below(t["fb12"], t["fb16-do"], 0.0))]
    out["seed000"] = (verdict(c), (
        f"FP32 {p('fp32')}, FB24 {p('fb24')}, FB16 {p('fb16')}: FB24/FB16 within {TOL:g} point of FP32: "
        f"{yes_no(c[0])}/{yes_no(c[1])}. Narrower blocks lose more than {TOL:g} point: FB12 {p('fb12')} "
        f"({yes_no(c[2])}), FB12LG16 {p('fb12lg16')} ({yes_no(c[3])}). FB16 with `--do Simple/0.6/0.8/0/1` "
        f"reaches {p('fb16-do')} on {_fmt(bits)} mean bits (FB16: 8, FB12: 4); fewer bits than FB16 and "
        f"above FB12: {yes_no(c[4])}."))
    c = [both(below(t[no], t["w8-fp32"]), below(t[no], t[yes]))
         for no, yes in (("w8-e4m3", "w8-e4m3-aps"), ("w8-e3m0", "w8-e3m0-aps"))]
    out["seed001"] = (verdict(c), (
        f"8 workers, FP32 all-reduce {p('w8-fp32')}. e4m3 gradients: {p('w8-e4m3')} without APS, "
        f"{p('w8-e4m3-aps')} with (loses without APS and recovers with it: {yes_no(c[0])}). e3m0 gradients: "
        f"{p('w8-e3m0')} without APS, {p('w8-e3m0-aps')} with ({yes_no(c[1])}). e4m3+APS with Kahan "
        f"{p('w8-e4m3-aps-kahan')}, with LARS {p('w8-e4m3-aps-lars')}. The rows above add in gloo's order "
        f"(the CPU backend's, on DDP's buckets); e4m3 in NCCL's ring {p('w8-e4m3-nccl-ring')}, tree "
        f"{p('w8-e4m3-nccl-tree')}, CPD's sequential {p('w8-e4m3-sequential')}, the per-parameter ring "
        f"{p('w8-e4m3-param-ring')}; e3m0 + APS in the same four: {p('w8-e3m0-aps-nccl-ring')}, "
        f"{p('w8-e3m0-aps-nccl-tree')}, {p('w8-e3m0-aps-sequential')}, {p('w8-e3m0-aps-param-ring')}."))
    sk = res.get("fp16grad-ls", {}).get("skipped_steps")
    c = [below(t["fp16grad"], t["fp32"]), near(t["fp16grad-ls"], t["fp32"]), near(t["bf16"], t["fp32"])]
    out["seed002"] = (verdict(c), (
        f"Simulated fp16 gradients without loss scaling {p('fp16grad')} against FP32 {p('fp32')} "
        f"(degrades by more than {TOL:g} point: {yes_no(c[0])}); with dynamic loss scaling "
        f"{p('fp16grad-ls')} ({'n/a' if sk is None else sk} skipped steps; about FP32: "
        f"{yes_no(c[1])}); bf16 autocast without scaling {p('bf16')} (about FP32: {yes_no(c[2])})."))
    out["formats"] = ("measured", (
        f"FP8 (e4m3/e5m2) {p('fp8')}, MXFP8 {p('mxfp8')} (RCEIL scale: {p('mxfp8-rceil')}), MXFP4 {p('mxfp4')}, "
        f"NVFP4 {p('nvfp4')} (TransformerEngine's convention: {p('nvfp4-te')}), FP8 with H100 fast accumulation "
        f"{p('fp8-h100-fast')} and promoted every 128 {p('fp8-h100-promoted')}, IEEE P3109 binary8p3 "
        f"{p('p3109-p3')} and binary8p4 {p('p3109-p4')} at every operand, against FP32 {p('fp32')}."))
    return out


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


def provenance(res: dict[str, dict]) -> tuple[Optional[str], str]:
    """(the one clean commit every result comes from, or None; a sentence saying so)."""
    commits: dict[str, int] = {}
    for d in res.values():
        c = d.get("git_commit") or "unknown"
        commits[c] = commits.get(c, 0) + 1
    if len(commits) == 1:
        (c, n), = commits.items()
        if "+dirty" not in c and c != "unknown" and all(d.get("citable") for d in res.values()):
            return c, f"Every result ({n}) comes from one clean commit, `{c}`."
    listed = ", ".join(f"`{c[:12]}{'+dirty' if '+dirty' in c else ''}` ({n})" for c, n in
                       sorted(commits.items(), key=lambda kv: -kv[1]))
    return None, (f"**Not one commit**: the results come from {len(commits)} source state(s): {listed}. Rows from "
                  f"another commit are rerun by `python -m bfp.experiments rerun-stale`.")


def machines(res: dict[str, dict], verified: list[dict] = ()) -> Optional[str]:
    """A sentence when the results come from more than one host (``reruns.host``), else None:
    torch's float32 kernels sum in an order that depends on the CPU, so the same clean commit can
    train to other digits on another host (FP32 70.36% and 70.28% from one command). ``verify``
    reruns of current rows (``reruns.ties``) that reproduced a row recorded on one host on another
    join the two; when they join every host the page says so instead of warning."""
    hosts: dict[str, int] = {}
    for d in res.values():
        hosts[reruns.host(d)] = hosts.get(reruns.host(d), 0) + 1
    if len(hosts) < 2:
        return None
    group = {h: h for h in hosts}

    def root(h: str) -> str:
        while group[h] != h:
            h = group[h]
        return h
    tied = [t for t in reruns.ties(res, list(verified)) if t["rerun"].get("host") in hosts]
    for t in tied:
        group[root(t["recorded"]["host"])] = root(t["rerun"]["host"])
    listed = "; ".join(f"{h} ({n})" for h, n in sorted(hosts.items(), key=lambda kv: -kv[1]))
    proof = " ".join(f"`{t['row']}` recorded on {t['recorded']['host']} was rerun on {t['rerun']['host']} "
                     f"({t['rerun'].get('date')}, commit `{str(t['rerun'].get('commit'))[:12]}`) and reproduced "
                     f"all {t['epochs']} recorded epochs exactly." for t in tied)
    if len({root(h) for h in hosts}) == 1:
        return (f"**{len(hosts)} hosts, shown to agree**: the results come from {listed}. Float32 kernels sum "
                f"in a CPU-dependent order, so hosts can differ; `verify` reruns join these: {proof}")
    return (f"**Not one machine**: the results come from {len(hosts)} machines: {listed}. Float32 kernels "
            f"sum in a CPU-dependent order, so rows from different machines differ by more than their code "
            f"does; a rerun on one machine compares them (`verify`)." + (f" Shown so far: {proof}" if proof else ""))


def _script(res: dict[str, dict], rows) -> str:
    cmd = next((d["command"] for d in res.values() if d.get("command")), None)
    return Path(cmd[0]).name if cmd else "cifar.py"


def _loss(doc: Optional[dict], bits: bool) -> Optional[float]:
    """The last epoch's test loss (nats; bits when ``bits``), None when there is none."""
    loss = doc["epochs"][-1].get("test_loss") if doc and doc["epochs"] else None
    return None if loss is None else loss / math.log(2) if bits else loss


def loss_lines(table: str, res: dict[str, dict], rows: tuple[matrix.Row, ...]) -> list[str]:
    """The transformer tables' final test losses (lm-table: bits per character, its measure), each
    with its difference to its row's reference; [] when no result has a test loss."""
    bits = table == "lm-table"
    have = [r for r in rows if _loss(res.get(r.name), bits) is not None]
    if not have:
        return []

    def cell(r: matrix.Row) -> str:
        mine, ref = _loss(res[r.name], bits), _loss(res.get(r.reference), bits)
        diff = f" ({mine - ref:+.3f} to {r.reference})" if ref is not None and r.name != r.reference else ""
        return f"`{r.name}` {mine:.3f}{diff}"
    return ["Final test loss" + (" in bits per character (nats / ln 2; lower is better)" if bits else " (nats)")
            + ": " + ", ".join(cell(r) for r in have) + "."]


def render(table: str, res: dict[str, dict], rows: tuple[matrix.Row, ...], doc: Path, img: Path,
           source: str = "", profile: str = "full", verified: list[dict] = ()) -> Path:
    """Write ``doc`` (Markdown) and its PNGs under ``img`` from ``res`` (the result files of
    folder ``source``, by file name); returns ``doc``. The page says at its top when the table is
    not complete, not of the full profile, or not from one clean commit, and when its rows come
    from several hosts, whether ``verified`` (``reruns.load``) shows them to agree."""
    any_doc = next(iter(res.values()), None)
    missing = [r.name for r in rows if r.name not in res]
    lines = [f"# Results: `{table}`", "",
             "Generated by `python -m bfp.experiments report " + table + "` from the result files in "
             f"`{source or 'results/' + table}/`; do not edit by hand. Every row is one "
             f"`{_script(res, rows)}` command (below), run by `python -m bfp.experiments run " + table
             + (" --data DIR" if _script(res, rows) != "lm.py" else "") + "`.", ""]
    if profile != "full":
        lines += [f"> **Profile `{profile}`: a machinery check, not results.** Its accuracies mean nothing.", ""]
    if missing:
        lines += [f"> **Incomplete table**: {len(rows) - len(missing)} of {len(rows)} rows have results; not run "
                  f"yet: {', '.join(missing)}. Verdicts that need those rows say so.", ""]
    commit, said = provenance(res) if res else (None, "No results yet.")
    lines += [said, ""]
    hosts = machines(res, verified)
    if hosts:
        lines += [hosts, ""]
    if any_doc:
        m, v = any_doc["machine"], any_doc["versions"]
        lines += ["## Setup", "", f"{any_doc['setup']}.", "",
                  f"Machine: {m.get('cpu')} ({m.get('cores')} cores{''.join(', ' + str(m[k]) for k in ('cpu_id', 'isa') if m.get(k))}), "
                  f"{m.get('platform')}; Python "
                  f"{m.get('python')}, torch {v.get('torch')}, numba {v.get('numba')}, numpy {v.get('numpy')}; "
                  f"threads {any_doc['threads']}. Times are training-epoch times on a shared 2-core machine (load "
                  "averages are in each result file), so their ratios are rough; a row's time is divided by "
                  "FP32's on the same host (FP32's own run, or a `verify` rerun of it there).", "",
                  ("Seeds: seed 0 for every row (this table's profile runs one seed)." if table != "cifar10-table"
                   else
                  f"Seeds: every row runs seed 0; the references (FP32, 8-worker FP32) and every row whose "
                  f"seed-0 difference to its reference lies within {MARGIN:g} points of a verdict's threshold "
                  f"(±{TOL:g} point) also run seeds 1 and 2. A verdict compares the seeds' means and counts a "
                  f"difference only where the seeds' ranges say so: \"within {TOL:g} point\" needs |Δ| plus "
                  f"the two half-ranges at most {TOL:g}, \"loses more than {TOL:g}\" needs Δ plus them below "
                  f"-{TOL:g}; otherwise the claim is \"not resolved at this scale\"."), ""]
        if table == "cifar10-table":
            noisy = reference_too_noisy(res, list(dict.fromkeys(r.reference for r in rows)))
            lines += [" ".join(noisy), ""] if noisy else []
    lines += ["## Table", "", *table_lines(res, rows, verified), "",
              "Δ: the mean final top-1 over the row's seeds minus its reference's (FP32"
              + ("; for the all-reduce panel 8-worker FP32), in points. Claims below compare final top-1 with a "
                 f"tolerance of {TOL:g} point, using the seeds' spread." if table == "cifar10-table" else
                 "), in points" + ("; top-1 is next-character accuracy" if table == "lm-table" else "") + "."), ""]
    if table != "cifar10-table":  # the transformer tables: measured, no seed's claim to check
        losses = loss_lines(table, res, rows)
        lines += [*losses, ""] if losses else []
        png = plot_claim(res, list(rows), table, img / f"{table}.png")
        if png is not None:
            rel = Path("img") / png.name if doc.parent == img.parent else png
            lines += [f"![{table}]({rel.as_posix()})", ""]
    else:
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
              ("Copy a row's command (run from the repository root; lm.py reads its embedded corpus). "
               if _script(res, rows) == "lm.py" else
               "Copy a row's command (run from the repository root, with the JPEG CIFAR-10 unpacked in "
              "`data/cifar10_jpg`, e.g. by `python -m bfp.experiments run ... --data "
              "../shared/data/cifar10-jpg.tar.gz`, or made from the CIFAR-10 site's archive by "
              "`python -m bfp.data prepare cifar10 --from cifar-10-python.tar.gz --out data/cifar10_jpg`). ")
              + "With the same thread count (`--threads 2`), seed, "
              "machine type and package versions, it reproduces the recorded per-epoch losses and "
              "accuracies exactly; `python -m bfp.experiments verify " + table + " --row NAME"
              + ("" if _script(res, rows) == "lm.py" else " --data DIR") + "` "
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


def splice(doc: Path, table: str, res: dict[str, dict], rows: tuple[matrix.Row, ...], page: str,
           verified: list[dict] = ()) -> bool:
    """Replace the block between ``<!-- table:TABLE -->`` and ``<!-- /table:TABLE -->`` in ``doc``
    (a hand-written page such as docs/transformers.md) with ``table``'s rows rendered from its
    result files, its provenance and a link to its generated ``page``; False where ``doc`` has no
    such block. The prose around the block stays the author's."""
    begin, end = f"<!-- table:{table} -->", f"<!-- /table:{table} -->"
    text = doc.read_text(encoding="utf-8") if doc.exists() else ""
    if begin not in text or end not in text.split(begin, 1)[1]:
        return False
    missing = [r.name for r in rows if r.name not in res]
    _, said = provenance(res) if res else (None, "No results yet.")
    losses = loss_lines(table, res, rows) if table != "cifar10-table" else []
    block = [begin, f"*Rendered from `results/{table}/` by `python -m bfp.experiments report {table}`; do not edit "
                    f"this block by hand. Commands, setup and curves: [{Path(page).name}]({Path(page).name}).* "
                    + said + (f" Not run yet: {', '.join(missing)}." if missing else ""), "",
             *table_lines(res, rows, verified), *(["", *losses] if losses else []), end]
    head, rest = text.split(begin, 1)
    doc.write_text(head + "\n".join(block) + rest.split(end, 1)[1], encoding="utf-8")
    return True
