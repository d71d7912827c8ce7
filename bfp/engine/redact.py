"""Removing a secret (the Slack token) from what a run writes, as a whole token only.

Why whole tokens: replacing every occurrence of a short secret as a substring
corrupted saved files (a token "0" turned ``"optim_lr": 0.1`` into ``***.1``).
A secret is replaced only where it stands alone: not inside a longer run of
letters, digits, ``_`` or ``-``, and not as a part of a decimal number.
Structured files are redacted value by value (``redact_json``), never by
rewriting their text, so they stay valid JSON.

A secret of ``ANYWHERE_LENGTH`` characters or more (a real Slack token has
over 40) is masked wherever it stands, inside a longer word too: in an
escaped or ``repr``'d message (``b'Bearer xoxb-...'``, ``'...\\nxoxb-...'``)
the characters beside it are escape letters, and a whole-token rule would let
it through. Such secrets are checked to be one word of printable ASCII by the
code that reads them (``bfp.engine.slack``), so every escaped form (``repr``,
bytes, JSON) still holds them verbatim.
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterable

MASK = "***"
ANYWHERE_LENGTH = 16


def pattern(secrets: Iterable[str]) -> re.Pattern | None:
    """A regex matching any of ``secrets``: as a whole token when shorter than
    ``ANYWHERE_LENGTH``, anywhere when longer; None when there are none."""
    alts = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not alts:
        return None
    long = [re.escape(s) for s in alts if len(s) >= ANYWHERE_LENGTH]
    short = [re.escape(s) for s in alts if len(s) < ANYWHERE_LENGTH]
    parts = long + ([r"(?<![\w-])(?<!\d\.)(?:" + "|".join(short) + r")(?![\w-])(?!\.\d)"] if short else [])
    return re.compile("|".join(parts))


def redact_text(text: str, pat: re.Pattern | None) -> str:
    return text if pat is None else pat.sub(MASK, text)


def redact_json(obj: Any, pat: re.Pattern | None) -> Any:
    """``obj`` as JSON values (``str()`` of anything JSON cannot hold) with every string and
    key redacted; numbers, booleans and the nesting are left as they are."""
    plain = json.loads(json.dumps(obj, default=str))

    def walk(v):
        if isinstance(v, str):
            return redact_text(v, pat)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {redact_text(k, pat): walk(x) for k, x in v.items()}
        return v
    return walk(plain)
