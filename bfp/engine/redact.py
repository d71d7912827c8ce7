"""Removing a secret (the Slack token) from what a run writes, as a whole token only.

Why whole tokens: replacing every occurrence of a short secret as a substring
corrupted saved files (a token "0" turned ``"optim_lr": 0.1`` into ``***.1``).
A secret is replaced only where it stands alone: not inside a longer run of
letters, digits, ``_`` or ``-``, and not as a part of a decimal number.
Structured files are redacted value by value (``redact_json``), never by
rewriting their text, so they stay valid JSON.
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterable

MASK = "***"


def pattern(secrets: Iterable[str]) -> re.Pattern | None:
    """A regex matching any of ``secrets`` as a whole token; None when there are none."""
    alts = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not alts:
        return None
    return re.compile(r"(?<![\w-])(?<!\d\.)(?:" + "|".join(map(re.escape, alts)) + r")(?![\w-])(?!\.\d)")


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
