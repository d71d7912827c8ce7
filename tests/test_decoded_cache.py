"""The decoded-image cache (bfp.data.decoded) is used only when it matches the images it claims to
hold: trimmed, zeroed, foreign or outdated caches are decoded anew, with a warning."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

from bfp.data import decoded


@pytest.fixture
def folder(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    samples = []
    for i in range(12):
        p = tmp_path / "imgs" / f"c{i % 3}" / f"{i}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(p)
        samples.append((str(p), i % 3))
    monkeypatch.setenv("BFP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "imgs", samples


def _only_cache(tmp_path):
    files = list((tmp_path / "cache").glob("*.pt"))
    assert len(files) == 1
    return files[0]


def _tamper(path, edit):
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


@pytest.mark.parametrize("edit", [
    lambda s: s.update(images=s["images"][:5], labels=s["labels"][:5]),          # trimmed
    lambda s: s.update(images=torch.zeros_like(s["images"])),                  # zeroed
    lambda s: s.update(labels=torch.zeros_like(s["labels"])),                  # other labels
    lambda s: s.update(fingerprint="0" * 64),                                  # another folder's
    lambda s: s.pop("sha256"),                                                 # an older cache
])
def test_a_cache_that_does_not_match_is_decoded_anew(folder, tmp_path, capsys, edit):
    root, samples = folder
    x, y = decoded.decode(samples, root, size=8)
    path = _only_cache(tmp_path)
    again = decoded.decode(samples, root, size=8)
    assert torch.equal(again[0], x) and "does not match" not in capsys.readouterr().err
    _tamper(path, edit)
    x2, y2 = decoded.decode(samples, root, size=8)
    assert torch.equal(x2, x) and torch.equal(y2, y)
    assert "does not match the images" in capsys.readouterr().err
    assert decoded._check(torch.load(path, weights_only=True), decoded._cache_path(samples, root, 8)[1],
                          samples, 8) is None  # replaced by a good one


def test_an_image_rewritten_in_place_is_decoded_again(folder, tmp_path):
    root, samples = folder
    x, _ = decoded.decode(samples, root, size=8)
    p = samples[0][0]
    img = np.asarray(Image.open(p)).copy()
    img[0, 0] = 255 - img[0, 0]
    Image.fromarray(img).save(p)
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the key holds the mtime: a rewrite is seen
    x2, _ = decoded.decode(samples, root, size=8)
    assert not torch.equal(x2[0], x[0]) and torch.equal(x2[1:], x[1:])
