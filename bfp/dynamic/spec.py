"""The ``--do`` spec grammar: ``Simple/LOWER/UPPER/INITIAL/HOLD[/EVERY][/LADDER]``.

``SimpleSpec`` is the validated, immutable value every other part of
``bfp.dynamic`` takes; ``parse_spec`` reads the command-line string into it
and ``str(spec)`` writes it back (checkpoints store that string). Also here:
the ladder arithmetic (``ladder_step``) and how linked pairs are named in
logs and state (``pair_name``), the vocabulary the controller, the callback
and the report share.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Union

from ..precision import LINKED_PAIRS

DEFAULT_LADDER = (4, 8, 16)
# Counting costs the kernel ~15% of a quantization on the CPU; one step in 4 keeps --do under 5%.
DEFAULT_SAMPLE = 4
COMBINE = ("max", "mean")
METHODS = ("simple",)

SPEC_FORM = ("Simple/LOWER/UPPER/INITIAL/HOLD[/EVERY][/LADDER], e.g. 'Simple/0.1/0.2/2/1', "
             "'Simple/0.1/0.2/50/1/500', 'Simple/0.1/0.2/2/1/4,8,12,16'; LOWER <= UPPER in "
             "[0, 1], INITIAL and HOLD integers >= 0, EVERY 'epoch' or an integer number of "
             "steps >= 1, LADDER increasing bit counts in 1..24 separated by commas; optional "
             "fields may also be written every=N, ladder=A,B,..., combine=max|mean, sample=N")


def pair_name(pair: Iterable[str]) -> str:
    """``("fw", "fi") -> "fw+fi"``: how pairs are named in logs and state."""
    return "+".join(pair)


PAIR_NAMES = tuple(pair_name(p) for p in LINKED_PAIRS)


def parse_every(value: Union[int, str, None], what: str) -> Union[int, str, None]:
    """``None``, ``"epoch"`` or a positive int (from an int or a digit string)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "epoch"):
        return None if value is None else "epoch"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be 'epoch' or an integer number of steps >= 1, got {value!r}")
    return value


def _parse_ladder(value: Union[str, Iterable[int]], what: str = "ladder") -> tuple[int, ...]:
    try:
        if isinstance(value, str):
            rungs = tuple(int(v) for v in value.split(","))
        else:
            rungs = tuple(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be increasing integers separated by commas "
                         f"(e.g. 4,8,16), got {value!r}") from None
    if (not rungs or any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 24 for b in rungs)
            or any(a >= b for a, b in zip(rungs, rungs[1:]))):
        raise ValueError(f"{what} must be strictly increasing BlockFloat bit counts in 1..24 "
                         f"(e.g. 4,8,16), got {value!r}")
    return rungs


@dataclass(frozen=True)
class SimpleSpec:
    """The "Simple" rule of the original simulator (FlexBlock), with its knobs.

    At each decision, for every layer and linked pair: a mean ZSE below
    ``lower`` lowers the bits one rung of ``ladder``, above ``upper`` raises
    them one rung (equal to a threshold: no change). The first ``initial``
    decisions change nothing; after a change that pair keeps its bits for the
    next ``hold`` decisions. ``every``: decide at each epoch end (``"epoch"``)
    or every that many training steps; ``None`` leaves it to the caller
    (default ``"epoch"``). ``combine``: how a pair's two points' ZSEs become
    one (``"max"``: the worse one decides, ``"mean"``: their average).
    ``sample``: measure one training step in ``sample`` (the first after each
    decision, then every ``sample``-th); 1 measures every step.
    """

    lower: float
    upper: float
    initial: int = 0
    hold: int = 0
    every: Union[int, str, None] = None
    ladder: tuple[int, ...] = DEFAULT_LADDER
    combine: str = "max"
    sample: int = DEFAULT_SAMPLE

    def __post_init__(self):
        for name in ("lower", "upper"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ValueError(f"Simple {name} threshold must be a number in [0, 1], got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.lower > self.upper:
            raise ValueError(f"Simple thresholds need LOWER <= UPPER, got lower={self.lower} "
                             f"> upper={self.upper}")
        for name in ("initial", "hold"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"Simple {name} must be an integer >= 0 (decisions), got {v!r}")
        object.__setattr__(self, "every", parse_every(self.every, "EVERY"))
        object.__setattr__(self, "ladder", _parse_ladder(self.ladder, "LADDER"))
        if self.combine not in COMBINE:
            raise ValueError(f"Simple combine must be one of {', '.join(COMBINE)}, got {self.combine!r}")
        if isinstance(self.sample, str) and self.sample.strip().isdigit():
            object.__setattr__(self, "sample", int(self.sample))
        if isinstance(self.sample, bool) or not isinstance(self.sample, int) or self.sample < 1:
            raise ValueError(f"Simple sample must be an integer >= 1 (measure one step in N), "
                             f"got {self.sample!r}")

    def __str__(self) -> str:
        """The canonical spec string; ``parse_spec(str(s)) == s``."""
        parts = ["Simple", _num(self.lower), _num(self.upper), str(self.initial), str(self.hold)]
        if self.every is not None:
            parts.append(str(self.every))
        if self.ladder != DEFAULT_LADDER:
            rungs = ",".join(map(str, self.ladder))
            parts.append(rungs if len(self.ladder) > 1 else f"ladder={rungs}")
        if self.combine != "max":
            parts.append(f"combine={self.combine}")
        if self.sample != DEFAULT_SAMPLE:
            parts.append(f"sample={self.sample}")
        return "/".join(parts)


def _num(x: float) -> str:
    return repr(x).rstrip("0").rstrip(".") if "." in repr(x) else repr(x)


def parse_spec(spec: Union[str, SimpleSpec]) -> SimpleSpec:
    """Parse ``--do``: ``Simple/LOWER/UPPER/INITIAL/HOLD[/EVERY][/LADDER]``.

    The optional fields after HOLD may come in any order and are told apart by
    their form: ``epoch`` or a plain integer is EVERY (a decision interval in
    training steps; the original's ImageNet example ``Simple/0.1/0.2/50/1/5``
    thus decides every 5 steps), a comma list is the LADDER (``4,8,12,16``),
    and ``key=value`` names a field (``every=``, ``ladder=``, ``combine=``, ``sample=``;
    ``ladder=8`` is the way to give a one-rung ladder). Raises ``ValueError``
    stating the expected form.
    """
    if isinstance(spec, SimpleSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"`spec` must be a string of the form {SPEC_FORM}; got {spec!r}")
    fields = [f.strip() for f in spec.strip().split("/")]
    method = fields[0].lower()
    if method not in METHODS:
        raise ValueError(f"unknown dynamic precision method {fields[0]!r} in {spec!r}; allowed: "
                         f"Simple; expected form {SPEC_FORM}")
    if len(fields) < 5:
        raise ValueError(f"`spec` {spec!r} has {len(fields) - 1} fields after 'Simple', needs at "
                         f"least 4; expected form {SPEC_FORM}")
    try:
        lower, upper = float(fields[1]), float(fields[2])
    except ValueError:
        raise ValueError(f"`spec` {spec!r}: LOWER and UPPER must be numbers, got {fields[1]!r} "
                         f"and {fields[2]!r}; expected form {SPEC_FORM}") from None
    if not (fields[3].isdigit() and fields[4].isdigit()):
        raise ValueError(f"`spec` {spec!r}: INITIAL and HOLD must be integers >= 0, got "
                         f"{fields[3]!r} and {fields[4]!r}; expected form {SPEC_FORM}")
    kw: dict[str, Any] = {}
    for field in fields[5:]:
        if "=" in field:
            key, _, value = field.partition("=")
            key = key.strip().lower()
            if key not in ("every", "ladder", "combine", "sample"):
                raise ValueError(f"`spec` {spec!r}: unknown field {key!r}; allowed keys: every, "
                                 f"ladder, combine, sample; expected form {SPEC_FORM}")
        elif "," in field:
            key, value = "ladder", field
        elif field.isdigit() or field.lower() == "epoch":
            key, value = "every", field
        else:
            raise ValueError(f"`spec` {spec!r}: cannot read field {field!r}; expected form "
                             f"{SPEC_FORM}")
        if key in kw:
            raise ValueError(f"`spec` {spec!r} gives {key} twice; expected form {SPEC_FORM}")
        kw[key] = value.strip()
    try:
        return SimpleSpec(lower, upper, int(fields[3]), int(fields[4]), **kw)
    except ValueError as e:
        raise ValueError(f"`spec` {spec!r}: {e}; expected form {SPEC_FORM}") from None


def ladder_step(bits: int, direction: int, ladder: tuple[int, ...]) -> int:
    """The rung ``direction`` (-1, 0, +1) steps from ``bits``; ladder ends stay put.

    Bits between rungs (a config with 6 bits on a 4,8,16 ladder) step to the
    nearest rung in that direction (6 -> 4 or 8); bits beyond an end stay.
    """
    if direction > 0:
        return next((b for b in ladder if b > bits), bits)
    if direction < 0:
        return next((b for b in reversed(ladder) if b < bits), bits)
    return bits
