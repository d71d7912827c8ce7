"""lm.py: the character-level language model task on the shared engine."""
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bfp.cli import run_task
from bfp.cli.flags import build_parser
from bfp.cli.param_flags import as_flags
from bfp.cli.tasks import TASKS
from bfp.engine import checkpoint as ckpt
from bfp.data.text import CORPUS_FILES, load_text
from bfp.models.gpt import GPT
from bfp.models.hf_gpt2 import HFGPT2

ROOT = Path(__file__).resolve().parents[1]
TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))


def lm(*argv) -> int:
    return run_task("lm", list(argv))


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


def small(tmp_path, *extra):
    return ["--model-opt", "dim=32", "--model-opt", "depth=1", "--model-opt", "heads=2", "--block-size", "16",
            "--batch-size-train", "16", "--batch-size-test", "32", "--threads", "1", "--progress", "False",
            "--optim-lr", "0.05", "--sample-chars", "40", "--run-dir", str(tmp_path / "runs"), *extra]


def test_text_windows_targets_are_the_next_characters(text_file):
    data = load_text(str(text_file), 16, batch_size_train=4)
    x, y = next(iter(data.train))
    assert x.shape == (4, 16) and y.shape == (64,)
    vocab = data.classes
    for row, target in zip(x.tolist(), y.view(4, 16).tolist()):
        s, t = "".join(vocab[i] for i in row), "".join(vocab[i] for i in target)
        assert s[1:] == t[:-1] and (s + t[-1]) in TEXT
    assert data.fingerprint["vocabulary"] == len(set(TEXT)) == data.num_classes


def test_default_corpus_is_offline_python_source():
    data = load_text(None, 64)
    assert data.name == "pysrc" and data.fingerprint["characters"] > 200_000
    assert len(CORPUS_FILES) == 10


def test_gpt_is_causal_and_flattens_logits():
    torch.manual_seed(0)
    m = GPT(11, block=8, dim=16, depth=1, heads=2).eval()
    x = torch.randint(0, 11, (2, 8))
    y = m(x).view(2, 8, 11)
    x2 = x.clone()
    x2[:, 5:] = (x2[:, 5:] + 1) % 11  # later tokens cannot change earlier predictions
    assert torch.equal(m(x2).view(2, 8, 11)[:, :5], y[:, :5])
    with pytest.raises(ValueError, match="block=8 got a sequence of 9"):
        m(torch.zeros(1, 9, dtype=torch.long))


def test_lm_trains_reports_bits_per_character_and_samples(tmp_path, text_file, capsys):
    assert lm(*small(tmp_path, "--data", str(text_file), "--training-epochs", "2", "--log", "True",
                     "--run-name", "t")) == 0
    out = capsys.readouterr().out
    assert "bits per character" in out and "sample:" in out
    rows = [json.loads(line) for line in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "test_loss" in r][-1]
    assert last["test_loss"] < 0.5 * math.log(len(set(TEXT)))  # well below a uniform guess


def test_lm_with_fp8_quantizes_the_attention_products(tmp_path, capsys):
    assert lm(*small(tmp_path, "--bfp", "any_fp8_e4m3", "--training-epochs", "1", "--limit-train-images", "64",
                     "--limit-test-images", "16")) == 0
    out = capsys.readouterr().out
    assert "blocks.0.attn.qk" in out and "blocks.0.attn.pv" in out


def test_hf_gpt2_is_transformers_model_with_flattened_logits_and_samples():
    """HFGPT2 is transformers' GPT2LMHeadModel of the given sizes (dropout 0): its logits, flattened;
    it samples like GPT; bad sizes and a missing transformers are named."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    m = HFGPT2(13, block=8, dim=16, depth=2, heads=2, mlp_ratio=3).eval()
    cfg = m.gpt2.config
    assert isinstance(m.gpt2, transformers.GPT2LMHeadModel)
    assert (cfg.vocab_size, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_inner) == (13, 8, 16, 2, 2, 48)
    assert cfg.resid_pdrop == cfg.embd_pdrop == cfg.attn_pdrop == 0.0
    x = torch.randint(0, 13, (3, 8))
    assert torch.equal(m(x), m.gpt2(input_ids=x).logits.reshape(24, 13))
    out = m.generate(x[:1, :2], 10, generator=torch.Generator().manual_seed(1))
    assert out.shape == (1, 12) and torch.equal(out[:, :2], x[:1, :2]) and int(out.max()) < 13
    with pytest.raises(ValueError, match="HFGPT2 with block=8 got a sequence of 9 tokens"):
        m(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="HFGPT2 dim 10 must be a multiple of heads 4"):
        HFGPT2(5, dim=10, heads=4)
    with pytest.raises(ValueError, match="HFGPT2 depth must be a positive integer, got 0"):
        HFGPT2(5, depth=0)


def test_hf_gpt2_without_transformers_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    with pytest.raises(ValueError, match=r"`arch` 'HFGPT2' needs Hugging Face transformers: pip install transformers") as e:
        HFGPT2(5)
    lm_task = TASKS["lm"]  # lm.py shows the parameter as its flag
    shown = as_flags(str(e.value), {a.dest for a in build_parser(lm_task)._actions}, lm_task.hooks.flag_spellings)
    assert shown == ("--model 'HFGPT2' needs Hugging Face transformers: pip install transformers "
                     "(or the project's test extra '.[test]')")


def test_lm_trains_hugging_face_gpt2_with_mxfp8_on_its_conv1d_and_attention(tmp_path, capsys):
    pytest.importorskip("transformers")
    assert lm(*small(tmp_path, "-m", "hfgpt2", "--bfp", "any_mxfp8", "--training-epochs", "1",
                     "--limit-train-images", "64", "--limit-test-images", "16", "--log", "True",
                     "--run-name", "hf")) == 0
    out = capsys.readouterr().out
    assert "gpt2.transformer.h.0.attn.qk" in out and "QTransposedLinear" in out
    assert "5 of 7 GEMMs quantized" in out and "sample:" in out
    assert (tmp_path / "runs" / "hf" / "metrics.jsonl").is_file()


def test_lm_resume_is_bit_exact(tmp_path, text_file):
    args = small(tmp_path, "--data", str(text_file), "--training-epochs", "2", "--save", "True",
                 "--save-interval", "1", "--limit-train-images", "48")
    assert lm(*args, "--run-name", "straight") == 0
    run = tmp_path / "runs" / "straight"
    branch = tmp_path / "runs" / "branch"
    shutil.copytree(run, branch)
    (branch / "checkpoints" / "last.pt").unlink()
    assert lm(*args, "--resume", str(branch / "checkpoints" / "epoch_001.pt")) == 0
    a, b = ckpt.load(run / "checkpoints" / "last.pt"), ckpt.load(branch / "checkpoints" / "last.pt")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert [h["test_loss"] for h in a["history"]] == [h["test_loss"] for h in b["history"]]


@pytest.mark.parametrize("extra,message", [
    (["--block-size", "1"], "--block-size must be >= 2, got 1"),
    (["--model", "ResNet18"], "allowed: GPT, HFGPT2"),
    (["--data", "/no/such.txt"], "/no/such.txt: no such file"),
    (["--model-opt", "width=4"], "does not take ['width']"),
    (["--dataset", "CIFAR10"], "allowed: pysrc"),
    (["--optim-momentum", "1"], "--optim-momentum is AdamW's beta1 under --optimizer adamw and must be in [0, 1)"),
])
def test_lm_bad_values_exit_2_naming_them(tmp_path, capsys, extra, message):
    assert lm(*small(tmp_path, "--training-epochs", "1", *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_lm_rejects_a_non_utf8_file(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc\xff\xfe" * 100)
    assert lm(*small(tmp_path, "--data", str(bad))) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_lm_py_script_runs_from_a_shell(tmp_path, text_file):
    res = subprocess.run([sys.executable, str(ROOT / "lm.py"), *small(tmp_path, "--data", str(text_file),
                          "--training-epochs", "1", "--limit-train-images", "32")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "bits per character" in res.stdout


def test_lm_help_shows_only_what_applies_and_max_steps_ends_the_run(tmp_path, capsys):
    from bfp.cli import main as bfp_main
    import pytest as _pytest
    with _pytest.raises(SystemExit):
        bfp_main(["lm", "--help"])
    text = capsys.readouterr().out
    for word in ("--in-channels", "ResNet", "VGG", "digits", "--strict-images", "--gpu-data", "-dp "):
        assert word not in text, word
    assert "--max-steps N" in text and "--data FILE.txt" in text and "windows per training step" in text
    assert bfp_main(["lm", "--max-steps", "3", "--limit-train-images", "2000", "--limit-test-images", "200",
                     "--progress", "False", "--sample-chars", "0", "--num-workers", "0"]) == 0
    out = capsys.readouterr().out
    assert "tok/s" in out and "img/s" not in out and "reached 3 steps" in out and "epoch 2/" not in out
    assert "CPU thread(s)" in out


@pytest.mark.parametrize("other", ["same characters", "other characters"])
def test_lm_refuses_a_resume_on_another_text(tmp_path, text_file, capsys, other):
    args = small(tmp_path, "--data", str(text_file), "--training-epochs", "2", "--save", "True",
                 "--save-interval", "1", "--limit-train-images", "48")
    assert lm(*args, "--run-name", "r") == 0
    (tmp_path / "runs" / "r" / "checkpoints" / "last.pt").unlink()
    resume = str(tmp_path / "runs" / "r" / "checkpoints" / "epoch_001.pt")
    text2 = tmp_path / "text2.txt"
    src = text_file.read_text()
    text2.write_text(src[::-1] if other == "same characters" else src + "@@ new chars \u00e9 @@")
    again = [*args[:args.index("--data")], "--data", str(text2), *args[args.index("--data") + 2:]]
    capsys.readouterr()
    assert lm(*again, "--resume", resume) == 2
    err = capsys.readouterr().err
    assert "the text's SHA-256" in err and "--resume-allow-data-change" in err and "Traceback" not in err
    assert "(None)" not in err and f"trained on ({text_file.name} -> {text2.name})" in err
    if other == "same characters":  # the same text moved elsewhere is the same data
        moved = tmp_path / "moved.txt"
        shutil.copy(text_file, moved)
        moved_args = [*args[:args.index("--data")], "--data", str(moved), *args[args.index("--data") + 2:]]
        assert lm(*moved_args, "--resume", resume) == 0


def test_sampling_is_bounded_and_runs_after_the_checkpoint_is_written(tmp_path, text_file, capsys, monkeypatch):
    assert lm(*small(tmp_path, "--data", str(text_file), "--sample-chars", "100000000")) == 2
    assert "--sample-chars must be in 0..10000" in capsys.readouterr().err
    seen = []
    real = GPT.generate

    def generate(self, *a, **k):  # what is on disk when the sample starts
        last = tmp_path / "runs" / "s" / "checkpoints" / "last.pt"
        seen.append(ckpt.load(last)["epoch"] if last.exists() else None)
        return real(self, *a, **k)
    monkeypatch.setattr(GPT, "generate", generate)
    assert lm(*small(tmp_path, "--data", str(text_file), "--training-epochs", "2", "--save", "True",
                     "--limit-train-images", "48", "--run-name", "s")) == 0
    assert seen == [1, 2]  # each epoch's sample only after its last.pt is in place
