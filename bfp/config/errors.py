"""Config errors: one exception type, and messages that name the source (a
path, a preset, ``<dict>``), the key and what is allowed there, with the
closest allowed spelling of a mistyped key or name."""
from __future__ import annotations

import difflib


class ConfigError(ValueError):
    """A network config that cannot be loaded or applied.

    The message names the source (file path or ``<dict>``), the key and what is
    allowed there.
    """


def _fail(source: str, where: str, msg: str) -> ConfigError:
    return ConfigError(f"{source}: {where}: {msg}" if where else f"{source}: {msg}")


def _unknown_keys(keys, allowed, source: str, where: str) -> None:
    bad = [k for k in keys if k not in allowed]
    if not bad:
        return
    hints = []
    for k in bad:
        close = difflib.get_close_matches(str(k), list(allowed), n=1)
        hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise _fail(source, where, f"unknown key{'s' if len(bad) > 1 else ''} {', '.join(hints)}; "
                               f"allowed: {', '.join(allowed)}")


def _suggest(name: str, candidates, n: int = 3) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.5)
    return f" (closest: {', '.join(close)})" if close else ""
