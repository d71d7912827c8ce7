"""``lm.py``'s parts on the shared engine: a character-level GPT on text (``bfp.data.text``).

The engine's classification loss and accuracy apply to next-character prediction (the
GPT's logits and the targets are flattened alike): ``train_loss``/``test_loss`` are
nats per character, ``*_acc1`` next-character accuracy. ``TextReport`` adds bits per
character (``loss / ln 2``) to the log and TensorBoard, and samples a few lines of text
at the end of each epoch from a generator of its own (the training's random state is
untouched, so a resumed run stays bit-exact).
"""
from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn as nn

from ..engine.callbacks import Callback
from ..data.text import load_text
from ..models.gpt import GPT
from ..models.hf_gpt2 import HFGPT2
from .task_base import TaskHooks

SAMPLE_PROMPT = "def "
MAX_SAMPLE_CHARS = 10_000  # one forward per character: about a second per 1,000 on a CPU (small GPT)


class TextReport(Callback):
    """Bits per character and a text sample after every epoch."""

    name = "text_report"

    def __init__(self, vocab: list[str], chars: int, seed: int):
        self.vocab, self.chars, self.seed = vocab, chars, seed

    def on_epoch_end(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        bpc = {k: metrics[f"{k}_loss"] / math.log(2) for k in ("train", "test")}
        trainer.log(f"epoch {epoch + 1}: bits per character train {bpc['train']:.3f} test {bpc['test']:.3f} "
                    f"(uniform: {math.log2(len(self.vocab)):.3f})")
        if trainer.writer is not None:
            for k, v in bpc.items():
                trainer.writer.add_scalar(f"lm/{k}_bits_per_char", v, epoch + 1)

    def on_epoch_saved(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        """The sample, once the epoch's checkpoints are written."""
        if not self.chars:
            return
        model = trainer.model
        lookup = {c: i for i, c in enumerate(self.vocab)}
        prompt = [lookup[c] for c in SAMPLE_PROMPT if c in lookup] or [0]
        dev = next(model.parameters()).device
        was = model.training
        model.eval()
        try:
            out = model.generate(torch.tensor([prompt], device=dev), self.chars,
                                 generator=torch.Generator().manual_seed(self.seed + epoch))
        finally:
            model.train(was)
        text = "".join(self.vocab[i] for i in out[0].tolist())
        trainer.log("sample:\n    " + "\n    ".join(text.splitlines()[:8]))


class LMHooks(TaskHooks):
    """Character-level language modelling: ``GPT`` (or transformers' GPT-2, ``HFGPT2``) on ``pysrc`` or
    ``--data FILE.txt``."""

    flag_spellings = {"dataset_path": "--data"}

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("language model")
        g.add_argument("--data", dest="dataset_path", default=None, metavar="FILE.txt",
                       help="a UTF-8 text file to model (default: the pysrc corpus, Python standard-library "
                            "source that every Python installation has)")
        g.add_argument("--block-size", type=int, default=64, help="characters of context per window")
        g.add_argument("--sample-chars", type=int, default=200,
                       help=f"characters sampled after each epoch, once its checkpoint is written "
                            f"(0: none; at most {MAX_SAMPLE_CHARS})")
        g.add_argument("--max-steps", type=int, default=0, metavar="N",
                       help="end the run after N optimizer steps in all (0: every epoch); the epoch that "
                            "reaches N is cut short, evaluated and saved")
        # a transformer's usual optimizer: AdamW at 3e-3 with decoupled decay 0.01; throughput in tokens/s
        parser.set_defaults(optimizer="adamw", optim_lr=3e-3, optim_weight_decay=0.01, sample_unit="tok")

    def help_overrides(self) -> dict[str, str]:
        hide = argparse.SUPPRESS  # image-only flags
        return {"model": "network: GPT (bfpsim's character-level decoder) or HFGPT2 (Hugging Face transformers' "
                         "GPT2LMHeadModel of the same sizes, random init; needs transformers); --model-opt dim=, "
                         "depth=, heads=, mlp_ratio=",
                "model_opt": "constructor option of the decoder, repeatable: dim, depth, heads, mlp_ratio",
                "dataset": "pysrc (the default corpus: Python standard-library source) or text (with --data)",
                "dataset_path": hide, "in_channels": hide, "strict_images": hide, "gpu_data": hide,
                "limit_train_images": "train on N windows of --block-size characters spread evenly over the "
                                      "text (smoke tests; 0: all)",
                "limit_test_images": "evaluate on N windows (0: all)",
                "network_config": "network config: a preset that fits any model (any_mxfp8, any_fp8_e4m3, "
                                  "any_nvfp4, ...; see conf_net/) or a JSON path; omitted: FP32",
                "batch_size_train": "windows per training step", "batch_size_test": "windows per evaluation batch"}

    def canonical_model(self, name: str) -> str:
        models = {"gpt": "GPT", "hfgpt2": "HFGPT2"}
        if str(name).lower() not in models:
            raise ValueError(f"--model {name!r}: lm.py trains a character-level decoder; allowed: GPT, HFGPT2")
        return models[str(name).lower()]

    def canonical_dataset(self, name: str) -> str:
        if str(name).lower() not in ("pysrc", "text"):
            raise ValueError(f"--dataset {name!r}: allowed: pysrc (the default corpus) or text (a file given "
                             f"with --data FILE.txt)")
        return str(name).lower()

    def derived(self, args: argparse.Namespace) -> dict[str, Any]:
        return {"dataset": "text"} if args.dataset == "pysrc" and args.dataset_path else {}

    def check_args(self, args: argparse.Namespace) -> None:
        if args.max_steps < 0:
            raise ValueError(f"--max-steps must be >= 0 (0: no limit), got {args.max_steps}")
        if args.block_size < 2:
            raise ValueError(f"--block-size must be >= 2, got {args.block_size}")
        if not 0 <= args.sample_chars <= MAX_SAMPLE_CHARS:
            raise ValueError(f"--sample-chars must be in 0..{MAX_SAMPLE_CHARS} (0: none; one forward per "
                             f"character after every epoch), got {args.sample_chars}")
        if args.dataset == "text" and not args.dataset_path:
            raise ValueError("--dataset text needs --data FILE.txt")

    def make_model(self, args: argparse.Namespace, num_classes: int, in_channels: int) -> nn.Module:
        opts = dict(args.model_opt)
        allowed = ("dim", "depth", "heads", "mlp_ratio")
        bad = sorted(set(opts) - set(allowed))
        if bad:
            raise ValueError(f"model {args.model} does not take {bad}; its options: {', '.join(allowed)} "
                             f"(the context is --block-size)")
        return (HFGPT2 if args.model == "HFGPT2" else GPT)(num_classes, block=args.block_size, **opts)

    def example_input(self, args: argparse.Namespace, in_channels: int) -> tuple[torch.Tensor, str]:
        return torch.zeros(2, args.block_size, dtype=torch.long), f"sequences of {args.block_size} characters"

    def load_data(self, args: argparse.Namespace, device: torch.device, shard: tuple[int, int, int]):
        data = load_text(args.dataset_path, args.block_size, batch_size_train=args.batch_size_train,
                         batch_size_test=args.batch_size_test, device=device, seed=args.seed,
                         limit_train=args.limit_train_images, limit_test=args.limit_test_images,
                         rank=shard[0], world=shard[1])
        self._vocab = data.classes
        return data

    def callbacks(self, args: argparse.Namespace) -> list:
        return [TextReport(self._vocab, args.sample_chars, args.seed)]
