"""Training-step overhead of models nobody here wrote (Hugging Face, timm), converted by tracing.

    python benchmarks/hf_overhead.py                        # every model, any_fp8_e4m3 and any_mxfp8
    python benchmarks/hf_overhead.py --models gpt2 --configs any_nvfp4 --steps 10 --json out.json

One training step (forward, backward, SGD update) of each model in FP32 and converted with each
config (``bfp.convert(model, cfg, example_input=x)``), timed in alternating rounds (_harness);
the ratio is of median step times within one run. Models: HF GPT-2 (4 blocks, width 128, 64
tokens), BERT (4 layers, width 128), ViT (32x32 images, patch 4), timm resnet18 and vit_tiny
(32x32), random init (no downloads), batch 8. Each row says how many GEMMs the trace found and
quantized.
"""
from __future__ import annotations

import argparse
import copy

import torch

import bfp
from _harness import alternate, emit_json, machine, print_table


def models():
    import timm
    import transformers as tf
    tok = torch.randint(0, 512, (8, 64))
    img = torch.randn(8, 3, 32, 32)
    return {
        "gpt2": (lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=4, n_head=4, n_embd=128, vocab_size=512,
                                                          n_positions=64, bos_token_id=0, eos_token_id=0)), tok),
        "bert": (lambda: tf.BertForSequenceClassification(tf.BertConfig(
            vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
            max_position_embeddings=64, num_labels=10)), tok),
        "hf_vit": (lambda: tf.ViTForImageClassification(tf.ViTConfig(
            image_size=32, patch_size=4, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=512, num_labels=10)), img),
        "timm_resnet18": (lambda: timm.create_model("resnet18", pretrained=False, num_classes=10), img),
        "timm_vit_tiny": (lambda: timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                                                    patch_size=4, num_classes=10), img),
    }


def step_fn(model, x):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        out = out.logits if hasattr(out, "logits") else out
        out.float().square().mean().backward()
        opt.step()
    return step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=None, help="subset of: gpt2 bert hf_vit timm_resnet18 "
                                                                 "timm_vit_tiny")
    ap.add_argument("--configs", nargs="+", default=["any_fp8_e4m3", "any_mxfp8"])
    ap.add_argument("--steps", type=int, default=8, help="timed rounds (each times every variant once)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    table = models()
    rows = []
    for name in args.models or list(table):
        make, x = table[name]
        torch.manual_seed(0)
        base = make().train()
        fns, cover = {"fp32": step_fn(base, x)}, {}
        for cfg in args.configs:
            m = bfp.convert(copy.deepcopy(base), cfg, example_input=x)
            cov = m.bfp_coverage
            cover[cfg] = f"{cov.quantized}/{len(cov.gemms)}"
            fns[cfg] = step_fn(m, x)
        t = alternate(fns, args.steps, warmup=2)
        for k in fns:
            rows.append({"model": name, "variant": k, "gemms_quantized": cover.get(k, "-"),
                         "step_ms": 1e3 * t.median(k), "ratio_to_fp32": t.median(k) / t.median("fp32")})
    print(f"batch 8, {torch.get_num_threads()} torch threads, median of {args.steps} rounds")
    print_table([("model", "s"), ("variant", "s"), ("GEMMs q", "s"), ("step ms", ".1f"), ("x fp32", ".2f")],
                [(r["model"], r["variant"], r["gemms_quantized"], r["step_ms"], r["ratio_to_fp32"]) for r in rows])
    emit_json({"meta": machine(steps=args.steps, threads=torch.get_num_threads()), "results": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
