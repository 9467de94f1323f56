"""A PyTorch Lightning DDP training (gloo, CPU): the ddp_train MLP as a ``LightningModule``, trained by
``lightning.Trainer`` with its DDP strategy, automatic optimisation (the forward and backward of the step
run inside ``optimizer.step(closure)``), ``self.log(..., sync_dist=True)`` (Lightning's own all-reduce of
the logged loss) and, with ``--accumulate K``, Lightning's gradient accumulation.

Same command-line contract as :mod:`obshub.workloads.ddp_train`: the processes are started by the caller
(torchrun, ``obshub demo``) with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (default 1),
``MASTER_ADDR``, ``MASTER_PORT``; Lightning then launches nothing itself (its ``LOCAL_RANK`` rule), runs
``LOCAL_WORLD_SIZE`` devices per node on ``WORLD_SIZE / LOCAL_WORLD_SIZE`` nodes, node ``RANK //
LOCAL_WORLD_SIZE`` (``NODE_RANK`` when set). Without them: one rank, a free local port::

    torchrun --nproc-per-node 2 -m obshub.workloads.lightning_train --steps 20
    obshub run -- torchrun --nproc-per-node 2 -m obshub.workloads.lightning_train --accumulate 2

One training step = one optimizer step (``trainer.global_step``): ``--accumulate`` batches of ``--batch``
samples, each loaded by an endless synthetic dataset that sleeps ``--step-sleep-ms / K`` per batch
(simulated data loading). One line per optimizer step on stdout: ``step N rank R time_ms T`` (T = wall
time from the previous optimizer step's end, or from the first batch's start, ms). Progress bar, logger,
checkpoints and model summary are off. Exit 0 after ``--steps``; 2 when MASTER_PORT is missing with
WORLD_SIZE > 1 or WORLD_SIZE is not a multiple of LOCAL_WORLD_SIZE.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn

from obshub.workloads.ddp_train import BATCH, CLASSES, FEATURES, HIDDEN, STEPS, build_model, rendezvous_env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m obshub.workloads.lightning_train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps (default {STEPS})")
    p.add_argument("--hidden", type=int, default=HIDDEN, help=f"MLP hidden width (default {HIDDEN})")
    p.add_argument("--batch", type=int, default=BATCH, help=f"samples per batch per rank (default {BATCH})")
    p.add_argument(
        "--accumulate", type=int, default=1, help="batches per optimizer step (accumulate_grad_batches, default 1)"
    )
    p.add_argument(
        "--step-sleep-ms",
        type=float,
        default=0.0,
        help="simulated data-loading time per optimizer step, ms, spread over its batches (default 0)",
    )
    a = p.parse_args(argv)
    if a.accumulate < 1:
        p.error(f"--accumulate {a.accumulate}: at least 1 batch per optimizer step")
    return a


class Synthetic(torch.utils.data.IterableDataset):
    """Endless batches ``(x: [batch, FEATURES] float, y: [batch] class index)`` of rank ``rank``'s own
    generator, each after ``sleep_s`` of simulated loading."""

    def __init__(self, batch: int, rank: int, sleep_s: float) -> None:
        super().__init__()
        self.batch, self.rank, self.sleep_s = batch, rank, sleep_s

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.rank)
        while True:
            if self.sleep_s:
                time.sleep(self.sleep_s)
            yield (
                torch.randn(self.batch, FEATURES, generator=gen),
                torch.randint(0, CLASSES, (self.batch,), generator=gen),
            )


def main(argv: list[str] | None = None) -> int:
    """Train; returns the process exit code."""
    args = parse_args(argv)
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    os.environ.setdefault("LOCAL_RANK", "0")
    if not rendezvous_env("lightning_train"):
        return 2
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if per_node < 1 or world % per_node:
        print(f"lightning_train: WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {per_node}", file=sys.stderr)
        return 2
    os.environ.setdefault("NODE_RANK", str(rank // per_node))
    torch.set_num_threads(1)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(1234)
            self.net = build_model(args.hidden)
            self.loss_fn = nn.CrossEntropyLoss()
            self.t0 = 0.0
            self.done = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = self.loss_fn(self.net(x), y)
            self.log("loss", loss, sync_dist=True, on_step=True, on_epoch=False)  # Lightning's all_reduce
            return loss

        def on_train_batch_start(self, batch, batch_idx) -> None:
            if not self.t0:
                self.t0 = time.perf_counter()

        def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
            if self.trainer.global_step > self.done:  # an optimizer step ended with this batch
                self.done = self.trainer.global_step
                now = time.perf_counter()
                sys.stdout.write(f"step {self.done - 1} rank {rank} time_ms {(now - self.t0) * 1000:.1f}\n")
                sys.stdout.flush()
                self.t0 = now

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    sleep_s = args.step_sleep_ms / args.accumulate / 1000
    loader = torch.utils.data.DataLoader(Synthetic(args.batch, rank, sleep_s), batch_size=None)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=world // per_node,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=args.steps,
        max_epochs=-1,
        accumulate_grad_batches=args.accumulate,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), loader)
    return 0


if __name__ == "__main__":
    sys.exit(main())
