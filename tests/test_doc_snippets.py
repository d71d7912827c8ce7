"""Every ```python block of README.md and docs/*.md runs as written.

Conventions for writers of docs (this docstring is their home):

* a block opened with ```python runs, alone, in a fresh interpreter, from an
  empty working directory;
* an HTML comment on the line(s) just above a block,
  ``<!-- doc-test: "TEXT" -> "SMALLER" -->``, replaces TEXT by SMALLER in the
  test's copy (small sizes; the TEXT must be in the block, so the note cannot
  go stale);
* a block opened with ```python no-run is illustrative (a fragment) and is not
  run; at most a quarter of the blocks may be that.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPEN = re.compile(r"^```python(?P<info>[^\n]*)$")
NOTE = re.compile(r'^<!-- doc-test: "(?P<old>.+?)" -> "(?P<new>.*?)" -->$')


def blocks(path: Path):
    """(line number, info string, code, replacements) of each ```python block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for i, line in enumerate(lines):
        m = OPEN.match(line)
        if not m:
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        notes, k = [], i - 1
        while k >= 0 and NOTE.match(lines[k]):
            notes.insert(0, NOTE.match(lines[k]).group("old", "new"))
            k -= 1
        out.append((i + 1, m.group("info").strip(), "\n".join(lines[i + 1:end]) + "\n", notes))
    return out


ALL = [(p, *b) for p in DOCS for b in blocks(p)]
RUN = [pytest.param(p, code, notes, id=f"{p.relative_to(ROOT)}:{line}")
       for p, line, info, code, notes in ALL if info != "no-run"]


def test_the_blocks_are_found_and_most_of_them_run():
    infos = [info for *_, info, _, _ in ALL]
    assert set(infos) <= {"", "no-run"}, infos  # a typo in an info string would skip a block silently
    assert len(ALL) >= 8 and 4 * infos.count("no-run") <= len(ALL)


@pytest.mark.parametrize("path, code, notes", RUN)
def test_python_block_runs(path, code, notes, tmp_path):
    for old, new in notes:
        assert old in code, f"doc-test note names {old!r}, which the block does not contain"
        code = code.replace(old, new)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, f"{path.name}:\n{code}\n{r.stderr[-3000:]}"
