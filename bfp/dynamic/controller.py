"""The Simple decision rule on plain numbers: no model, no tensors, no torch.

Kept apart from the callback so the rule can be read, tested on scripted ZSE
sequences and reused without a training loop. Its whole state is a decision
index and the hold timers, both plain values for checkpoints.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Union

from .spec import SimpleSpec, ladder_step, parse_spec


class SimpleController:
    """The Simple rule on plain values: no model, no tensors.

    ``decide({key: (zse, bits)})`` returns ``{key: new_bits}`` for every key
    and advances the decision index. ``zse`` may be ``None`` or NaN when
    nothing was measured; such a key keeps its bits (its hold timer still
    counts down). Keys are any strings (``DynamicPrecision`` uses
    ``"layer|pair"``).
    """

    def __init__(self, spec: Union[str, SimpleSpec]):
        self.spec = parse_spec(spec)
        self.decision = 0  # index of the next decision
        self.hold: dict[str, int] = {}  # decisions a key still keeps its bits

    def decide(self, observations: Mapping[str, tuple[Optional[float], int]]) -> dict[str, int]:
        s = self.spec
        out = {}
        for key, (zse, bits) in observations.items():
            new = bits
            held = self.hold.get(key, 0)
            if held > 0:
                self.hold[key] = held - 1
            elif self.decision >= s.initial and zse is not None and not math.isnan(zse):
                if zse < s.lower:
                    new = ladder_step(bits, -1, s.ladder)
                elif zse > s.upper:
                    new = ladder_step(bits, +1, s.ladder)
                if new != bits and s.hold:
                    self.hold[key] = s.hold
            out[key] = new
        self.decision += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "hold": {k: v for k, v in self.hold.items() if v}}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.decision = int(d["decision"])
        self.hold = {str(k): int(v) for k, v in d["hold"].items()}
