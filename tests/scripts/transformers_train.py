"""Transformers' `Trainer` with `MultiRankCallback`: launched by tests/runs/test_transformers_callback.py
under ``torchrun --nproc-per-node 2`` (CPU, gloo). A tiny GPT-2 built from a config (no hub),
fed random embeddings: each rank its own batches (the Trainer's distributed sampler), so its own
loss. Options plant what the run must show: one rank's batches NaN from a batch on, a rank that
raises; rank 0 may hold a step until its watch alerted (an alert during training).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from multirank_logger import MultiRankCallback

SEQ, EMBD, VOCAB = 8, 16, 64


class Batches:
    """The collator: this rank's batch, planted with NaN or an error from a batch index on."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = int(os.environ.get("RANK", "0"))
        self.calls = 0

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = {k: torch.stack([item[k] for item in items]) for k in items[0]}
        if self.rank == self.args.raise_rank and self.calls == self.args.raise_at:
            raise RuntimeError(f"rank {self.rank} fails at batch {self.calls}")
        if self.rank == self.args.nan_rank and self.calls >= self.args.nan_from:
            batch["inputs_embeds"][0, 0, 0] = float("nan")  # a bad shard
        self.calls += 1
        return batch


class AwaitAlert(TrainerCallback):
    """Rank 0 holds a step (rank 1 waits in the next all-reduce) until the watch alerted."""

    def __init__(self, multirank: MultiRankCallback, step: int) -> None:
        self.multirank, self.step = multirank, step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self.multirank.run
        if state.global_step != self.step or run is None or run.rank != 0:
            return
        deadline = time.monotonic() + 120
        while not run.alerts:
            if time.monotonic() > deadline:
                raise TimeoutError("no alert from the watch within 120 s")
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--nan-rank", type=int, default=-1)
    parser.add_argument("--nan-from", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--await-alert-at", type=int, default=-1)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=EMBD, n_layer=1, n_head=2))
    data = torch.Generator().manual_seed(1)
    dataset = [
        {"inputs_embeds": torch.randn(SEQ, EMBD, generator=data), "labels": torch.randint(0, VOCAB, (SEQ,), generator=data)}
        for _ in range(64)
    ]
    training = TrainingArguments(
        output_dir="out", run_name="hf", use_cpu=True, report_to=[], max_steps=args.steps, per_device_train_batch_size=4,
        logging_steps=1, save_strategy="no", learning_rate=1e-3, dataloader_num_workers=0, disable_tqdm=True,
    )
    multirank = MultiRankCallback(db=args.db, flush_interval=0.5)
    callbacks: list[TrainerCallback] = [multirank]
    if args.await_alert_at >= 0:
        callbacks.append(AwaitAlert(multirank, args.await_alert_at))
    trainer = Trainer(model=model, args=training, train_dataset=dataset, data_collator=Batches(args), callbacks=callbacks)
    trainer.train()


if __name__ == "__main__":
    main()
