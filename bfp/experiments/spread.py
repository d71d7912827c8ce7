"""Verdicts from several seeds: a difference counts only where the seeds' ranges say so.

A row's accuracy is the list of its seeds' final top-1 (seed 0 is the row's first run; seeds 1
and 2 run for the references and for the rows whose seed-0 verdict lies within ``MARGIN``
points of a threshold, see ``needs_seeds``). Two rows ``a`` and ``b`` are compared by the
difference of their means ``d`` and the sum ``s`` of their half-ranges ((max - min) / 2 each;
0 for one seed):

* ``near(a, b)`` ("within TOL points"): yes when ``|d| + s <= TOL``; no when ``|d| - s > TOL``;
  otherwise ``UNRESOLVED`` (the seeds straddle the threshold);
* ``below(a, b)`` ("more than TOL points under"): yes when ``d + s < -TOL``; no when
  ``d - s >= -TOL``; otherwise ``UNRESOLVED``.

With one seed each, ``s = 0`` and these are the plain comparisons. ``None`` stands for a
comparison one of whose rows has no result.
"""
from __future__ import annotations

from statistics import mean
from typing import Optional, Union

TOL = 1.0      # points of top-1: closer counts as "about as well", farther as a loss or a gain
MARGIN = 3.0   # points: a seed-0 verdict this close to its threshold gets seeds 1 and 2
UNRESOLVED = "unresolved"
Check = Union[bool, str, None]


def seed_key(name: str, seed: int) -> str:
    """The result file's and run directory's name of row ``name`` with ``seed``: the row's name for
    seed 0 (the table's first run), ``<row>-s<seed>`` for the others (``matrix.key``)."""
    return name if seed == 0 else f"{name}-s{seed}"


def top1s(res: dict[str, dict], name: str, seeds: tuple[int, ...] = (0, 1, 2)) -> list[float]:
    """Final top-1 of every seed of row ``name`` that has a result (seed 0 is ``name`` itself)."""
    return [res[k]["final_top1"] for k in (seed_key(name, s) for s in seeds) if k in res]


def summary(values: list[float]) -> Optional[tuple[float, float, float]]:
    """(mean, min, max), or None without values."""
    return (mean(values), min(values), max(values)) if values else None


def _half(v: list[float]) -> float:
    return (max(v) - min(v)) / 2


def _diff(a: list[float], b: list[float]) -> tuple[float, float]:
    return mean(a) - mean(b), _half(a) + _half(b)


def near(a: list[float], b: list[float], tol: float = TOL) -> Check:
    if not a or not b:
        return None
    d, s = _diff(a, b)
    return True if abs(d) + s <= tol else False if abs(d) - s > tol else UNRESOLVED


def below(a: list[float], b: list[float], tol: float = TOL) -> Check:
    if not a or not b:
        return None
    d, s = _diff(a, b)
    return True if d + s < -tol else False if d - s >= -tol else UNRESOLVED


def both(x: Check, y: Check) -> Check:
    if x is None or y is None:
        return None
    if x is False or y is False:
        return False
    return UNRESOLVED if UNRESOLVED in (x, y) else True


def verdict(checks: list[Check]) -> str:
    known = [c for c in checks if c is not None]
    if not known:
        return "not run yet"
    if len(known) < len(checks):
        return "partly run"
    if UNRESOLVED in known:
        return "not resolved at this scale"
    return "reproduced" if all(known) else ("partly reproduced" if any(known) else "not reproduced")


def yes_no(c: Check) -> str:
    return "n/a" if c is None else "not resolved" if c == UNRESOLVED else ("yes" if c else "no")


def needs_seeds(res: dict[str, dict], name: str, reference: str, references: set[str],
                tol: float = TOL, margin: float = MARGIN) -> Optional[bool]:
    """Whether row ``name`` runs seeds 1 and 2: always for a reference row; for another row, when
    its seed-0 difference to its ``reference`` lies within ``margin`` points of a threshold (+-tol).
    None while seed 0 of the row or of its reference has no result (decided later)."""
    if name in references:
        return True
    if name not in res or reference not in res:
        return None
    d = res[name]["final_top1"] - res[reference]["final_top1"]
    return min(abs(d - tol), abs(d + tol)) <= margin


def reference_too_noisy(res: dict[str, dict], references: list[str], tol: float = TOL) -> list[str]:
    """Sentences for each reference whose own seeds' half-range exceeds ``tol``: then ``near`` can
    never say yes against it (|d| + s > tol whatever the other row's seeds), so every "within tol"
    claim on it stays unresolved at this scale; a "more than tol under" claim still resolves."""
    out = []
    for ref in references:
        v = top1s(res, ref)
        if len(v) > 1 and _half(v) > tol:
            out.append(f"`{ref}`'s own {len(v)} seeds span {max(v) - min(v):.2f} points ({min(v):.2f} to "
                       f"{max(v):.2f}): half of that is more than the {tol:g}-point tolerance, so no \"within "
                       f"{tol:g} point\" claim against `{ref}` can be resolved at this scale, whatever the other "
                       f"row's seeds; \"loses more than {tol:g}\" claims still can be.")
    return out
