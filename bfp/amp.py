"""The mixed-precision policy a ``Trainer`` is given: compute dtype plus loss scaler, one object.

``MixedPrecision(compute_dtype, device_type)``:

* ``"fp32"``: no autocast, no scaling.
* ``"bf16"``: ``torch.autocast`` to bfloat16; no loss scaling (bfloat16 has
  float32's exponent range, so gradients do not underflow for lack of range).
* ``"fp16"``: ``torch.autocast`` to float16 with dynamic loss scaling
  (``torch.amp.GradScaler``): the loss is multiplied by a scale starting at
  2^16 before backward; a step whose gradients hold Inf/NaN is skipped and the
  scale halved; after 2000 clean steps in a row the scale doubles. Gradients
  are unscaled before the optimizer sees them.

Weights, gradients and optimizer state stay float32 in every case. This is
independent of the simulated formats of a network config (``--bfp``), which
round values inside the Q-layers whatever the compute dtype.
"""
from __future__ import annotations

from typing import Any

import torch

COMPUTE_DTYPES = ("fp32", "fp16", "bf16")
_TORCH_DTYPE = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
INIT_SCALE = 2.0 ** 16


def check_compute_dtype(name: str) -> str:
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"--precision {name!r}: allowed {', '.join(COMPUTE_DTYPES)}")
    return name


class MixedPrecision:
    """Autocast and loss scaling for one run; its state (the scale) goes into checkpoints."""

    def __init__(self, compute_dtype: str = "fp32", device_type: str = "cpu", *,
                 init_scale: float = INIT_SCALE):
        self.compute_dtype = check_compute_dtype(compute_dtype)
        self.dtype = _TORCH_DTYPE[compute_dtype]
        self.device_type = device_type
        self.scaler = torch.amp.GradScaler(device_type, init_scale=init_scale,
                                           enabled=compute_dtype == "fp16")

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale, step unless gradients overflowed, update the scale."""
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)
