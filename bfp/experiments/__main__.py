"""``python -m bfp.experiments``: run, list, verify and report the experiment matrices.

    python -m bfp.experiments run cifar10-table --data ../shared/data/cifar10-jpg.tar.gz
    python -m bfp.experiments list cifar10-table --data data/cifar10_jpg     # the commands, nothing run
    python -m bfp.experiments report cifar10-table                          # docs/RESULTS.md + docs/img/
    python -m bfp.experiments verify cifar10-table --row fb16 --data data/cifar10_jpg
    python -m bfp.experiments rerun-stale cifar10-table --data data/cifar10_jpg  # rows whose sources changed

``run`` is resumable: rows with a result file are skipped, a killed row
resumes from its checkpoint (bfp.experiments.runner). ``--profile quick`` is
the machinery check CI runs (a few hundred images, one epoch, three rows);
its results go under ``runs/`` so they never mix with the committed ones,
and so does its report. ``rerun-stale`` sets aside every result whose commit
differs from HEAD in the library or the script (``--all``: every result not
from HEAD) and reruns those rows from HEAD (bfp.experiments.stale).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from ..data.archives import image_folder
from . import matrix, report, results, reruns, runner, stale

# Hand-written pages with a block rendered from a table's result files (report.splice).
SPLICED = {"vit-table": "docs/transformers.md", "lm-table": "docs/transformers.md"}


def data_folder(arg: str, extract_to: Path) -> str:
    """``--data``: an image folder, or its archive unpacked into ``extract_to`` once
    (``bfp.data.archives.image_folder``); ValueError naming the flag."""
    return str(image_folder(arg, extract_to, "--data"))


def writable_dir(path: Path, flag: str) -> Path:
    """``path``, made if missing; ValueError naming ``flag`` when it is a file or not writable."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a file; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {str(path)!r}: cannot create it ({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(path)!r} is not writable")
    return path


def _dirs(args) -> tuple[Path, Path]:
    quick = args.profile != "full"
    res = Path(args.results or (f"runs/{args.table}-{args.profile}/results" if quick else f"results/{args.table}"))
    runs = Path(args.runs or f"runs/{args.table}-{args.profile}")
    return res, runs


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bfp.experiments", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["run", "list", "report", "verify", "rerun-stale"])
    p.add_argument("table", choices=list(matrix.TABLES))
    p.add_argument("--data", help="CIFAR-10 JPEG folder (train/, test/) or its .tar.gz (unpacked into "
                                  "--extract-to once)")
    p.add_argument("--extract-to", default="data", help="where a --data archive is unpacked (default data/)")
    p.add_argument("--profile", default="full", choices=list(matrix.PROFILES),
                   help="full: the published table; quick: a machinery check (CI)")
    p.add_argument("--rows", default=None, help="comma-separated row names (default: the profile's rows)")
    p.add_argument("--row", default=None, help="verify: the row to rerun")
    p.add_argument("--epochs", type=int, default=None, help="override the profile's epoch count (tests)")
    p.add_argument("--results", default=None, help="result folder (default results/<table>; quick: under runs/)")
    p.add_argument("--runs", default=None, help="run directories (default runs/<table>-<profile>)")
    p.add_argument("--doc", default=None, help="report: the Markdown file to write (default docs/RESULTS.md; "
                                               "for a quick profile, beside its results under runs/)")
    p.add_argument("--all", action="store_true",
                   help="rerun-stale: every result not from HEAD, not only those whose sources changed")
    p.add_argument("--dry-run", action="store_true", help="rerun-stale: say what is stale and why, run nothing")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run: record rows from a source tree with uncommitted changes (marked not citable)")
    p.add_argument("--img", default=None, help="report: the folder for the PNG curves (default docs/img; "
                                               "quick profile: beside its report)")
    args = p.parse_args(argv)
    try:
        prof, rows = matrix.profile(args.profile, args.table), matrix.table(args.table)
        wanted = [r for r in args.rows.split(",") if r] if args.rows else None
        chosen = matrix.select(rows, prof, wanted)
        if args.epochs is not None and args.epochs < 1:
            raise ValueError(f"--epochs must be a positive integer, got {args.epochs}")
        res_dir, runs_dir = _dirs(args)
        if args.action == "report":
            quick = prof.name != "full"
            published = {"cifar10-table": "docs/RESULTS.md"}.get(args.table, f"docs/results-{args.table}.md")
            args.doc = args.doc or (str(runs_dir / "RESULTS.md") if quick else published)
            args.img = args.img or (str(runs_dir / "img") if quick else "docs/img")
            doc = Path(args.doc)
            if doc.is_dir():
                raise ValueError(f"--doc {args.doc!r} is a folder; give the Markdown file to write (e.g. "
                                 f"{(doc / 'RESULTS.md').as_posix()})")
            writable_dir(doc.parent if str(doc.parent) else Path("."), "--doc")
            if doc.exists() and not os.access(doc, os.W_OK):
                raise ValueError(f"--doc {args.doc!r} is not writable")
            writable_dir(Path(args.img), "--img")
            res, verified = results.load_results(res_dir, args.table, prof.name), reruns.load(res_dir)
            out = report.render(args.table, res, rows, Path(args.doc), Path(args.img), res_dir.as_posix(), prof.name,
                                verified)
            print(f"wrote {out}")
            if not quick and args.table in SPLICED and report.splice(Path(SPLICED[args.table]), args.table, res, rows,
                                                                     args.doc, verified):
                print(f"updated its block in {SPLICED[args.table]}")
            return 0
        if args.action == "rerun-stale" and args.dry_run:
            return rerun_stale(args, prof, chosen, None, res_dir, runs_dir)
        if args.action in ("run", "verify", "rerun-stale"):  # before any unpacking or training
            writable_dir(res_dir, "--results")
            writable_dir(runs_dir, "--runs")
        if prof.data_flag is None:  # the script's embedded data (lm.py's corpus)
            if args.data:
                raise ValueError(f"--data: the {args.table} rows use {prof.script}'s embedded data; drop --data")
            data = ""
        elif args.action == "list" and not args.data:
            data = "DATA"  # the commands, with the folder left to fill in
        elif not args.data:
            raise ValueError("--data is required: the CIFAR-10 JPEG folder or its .tar.gz "
                             "(../shared/data/cifar10-jpg.tar.gz in this project; make one from the "
                             "CIFAR-10 site's archive with: python -m bfp.data prepare cifar10 --from "
                             "cifar-10-python.tar.gz --out data/cifar10_jpg)")
        else:
            data = data_folder(args.data, Path(args.extract_to))
        if args.action == "list":
            for r in chosen:
                print(f"# {r.name}: {r.words}\n{matrix.shell(matrix.command(r, prof, data, str(runs_dir), args.epochs))}")
            return 0
        if args.action == "verify":
            return verify(args, prof, rows, data, res_dir, runs_dir)
        if args.action == "rerun-stale":
            return rerun_stale(args, prof, chosen, data, res_dir, runs_dir)
        print(f"{args.table}, profile {prof.name}: {prof.about}\nresults -> {res_dir}, runs -> {runs_dir}")
        return runner.run(args.table, chosen, prof, data, res_dir, runs_dir, args.epochs, allow_dirty=args.allow_dirty)
    except ValueError as e:
        print(f"python -m bfp.experiments: error: {e}", file=sys.stderr)
        return 2


def rerun_stale(args, prof, chosen, data: Optional[str], res_dir: Path, runs_dir: Path) -> int:
    """Set aside the stale results (``stale.find``) of the chosen rows and rerun them from HEAD."""
    names = {r.name for r in chosen}
    found = {k: why for k, why in stale.find(res_dir, runner.REPO, args.all, args.table).items()
             if matrix.base_name(k) in names}
    for k, why in sorted(found.items()):
        print(f"stale: {k}: {why}")
    if not found:
        print(f"no stale results in {res_dir}")
    if data is None:  # --dry-run
        return 0
    runner.check_clean(False)  # before anything moves: the reruns must be citable
    if found:
        print(f"set aside in {stale.set_aside(sorted(found), res_dir, runs_dir, runner.source_commit())}")
    print(f"{args.table}, profile {prof.name}: {prof.about}\nresults -> {res_dir}, runs -> {runs_dir}")
    return runner.run(args.table, chosen, prof, data, res_dir, runs_dir, args.epochs)


def verify(args, prof, rows, data, res_dir: Path, runs_dir: Path) -> int:
    """Rerun one row from scratch into a scratch folder and compare its per-epoch numbers with the
    recorded result, exactly (``bfp.experiments.reruns``)."""
    if not args.row:
        raise ValueError("verify needs --row NAME")
    return reruns.verify(args.table, matrix.select(rows, prof, [args.row])[0], prof, data, res_dir, runs_dir)


if __name__ == "__main__":
    sys.exit(main())
