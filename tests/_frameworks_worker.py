"""One rank of a framework's training run under torchrun (tests/test_integrations.py).

    python -m torch.distributed.run --nproc-per-node 2 tests/_frameworks_worker.py FRAMEWORK HOW OUT

FRAMEWORK ``lightning`` (a LightningModule, DDPStrategy on gloo) or ``hf`` (a GPT-2 in Hugging
Face's Trainer, ddp_backend gloo); HOW ``callback`` (bfp's callback, e4m3), ``strategy_hook``
(Lightning's own ``DDPStrategy(ddp_comm_hook=...)``, which a CPU run ignores) or ``none``. Two
optimizer steps; each rank saves OUT/rank<r>.pt with its weights and the hook's call count.
"""
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bfp.distributed.hook import RoundedHookState, rounded_allreduce_hook  # noqa: E402
from bfp.integrations import as_reduce  # noqa: E402


def lightning_run(how: str):
    from bfp.integrations.lightning import RoundedAllReduce, pl
    DDPStrategy = pl.strategies.DDPStrategy

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 4)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.fc(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    state, callbacks = RoundedHookState(as_reduce("e4m3")), []
    kw = dict(process_group_backend="gloo")
    if how == "strategy_hook":
        kw.update(ddp_comm_hook=rounded_allreduce_hook, ddp_comm_state=state)
    if how == "callback":
        callbacks.append(RoundedAllReduce("e4m3"))
    model = Net()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(**kw), max_steps=2, callbacks=callbacks,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    calls = callbacks[0].state.calls if callbacks else state.calls
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, calls


def hf_run(how: str, out: Path):
    import transformers
    from bfp.integrations.hf_trainer import RoundedAllReduceCallback
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 64, (32, 8), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = transformers.TrainingArguments(output_dir=str(out / "hf"), per_device_train_batch_size=4, max_steps=2,
                                          learning_rate=1e-2, ddp_backend="gloo", use_cpu=True, report_to=[],
                                          save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
                                          disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    cb = None
    if how == "callback":
        cb = RoundedAllReduceCallback(trainer, "e4m3")
        trainer.add_callback(cb)
    trainer.train()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, (cb.state.calls if cb else 0)


def main() -> int:
    framework, how, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    torch.set_num_threads(1)
    weights, calls = lightning_run(how) if framework == "lightning" else hf_run(how, out)
    torch.save({"weights": weights, "calls": calls}, out / f"rank{os.environ['RANK']}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
