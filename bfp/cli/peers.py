"""What a failed collective looks like: a peer process died, froze or cannot be reached. One rule
for the command line's exit 4 and for every place that must not mistake such a failure for another
(a resume that would blame the checkpoint)."""
from __future__ import annotations

import re
from typing import Optional

# What gloo/NCCL/c10d errors say when a peer dies, freezes or its connection goes
# ("Connection closed by peer", "Timed out waiting ... for recv", "Application timeout
# caused pair closure", ...).
PEER_FAILURE = re.compile(r"gloo|nccl|c10d|timed out|timeout|connection|by peer|pair closure|socket", re.I)


def peer_failure(e: BaseException, resumable: bool = True) -> Optional[str]:
    """The message for a collective that failed because another process died, froze or became
    unreachable (gloo/NCCL errors, --dist-timeout expiring); None for any other error.
    ``resumable`` False (a run that saves no checkpoints, --save False): no --resume advice."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    text = str(e)
    if not (isinstance(e, getattr(dist, "DistError", ())) or PEER_FAILURE.search(text)):
        return None
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    return (f"rank {dist.get_rank()} of {dist.get_world_size()}: a collective failed ({first[:300]}). Another "
            f"process died, was stopped or cannot be reached, or waited longer than --dist-timeout; every rank "
            f"stops. " + ("Checkpoints of finished epochs are kept: continue with --resume <run directory> and the "
                          "same number of processes" if resumable else
                          "This run saves no checkpoints (--save False): start it again"))
