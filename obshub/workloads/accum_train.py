"""A DDP training with gradient accumulation (gloo, CPU): ``--accum K`` micro-batches per optimizer step,
the gradient all-reduce skipped (``DistributedDataParallel.no_sync``) on the first K-1 of them, the usual
way to train a large effective batch on few ranks.

Same command-line contract as :mod:`obshub.workloads.ddp_train` (run under torchrun or plain python with
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``; without them one rank)::

    torchrun --nproc-per-node 2 -m obshub.workloads.accum_train --steps 20 --accum 4
    obshub run -- torchrun --nproc-per-node 2 -m obshub.workloads.accum_train

One training step = one optimizer step = K micro-batches: each micro-batch sleeps ``--step-sleep-ms / K``
(simulated data loading, so a step loads as much as a ddp_train step), makes ``--batch / K`` samples, runs
forward, loss (divided by K) and backward, inside ``no_sync()`` except the last (whose backward all-reduces
the accumulated gradients); then an all_reduce of the loss for logging and SGD ``optimizer.step()``. One
line per optimizer step on stdout: ``step N rank R time_ms T`` (T = wall time of the step, ms). A barrier
at the end, then exit 0. Exit 2 for ``--accum`` below 1 or above ``--batch``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from obshub.workloads.ddp_train import BATCH, CLASSES, FEATURES, HIDDEN, STEPS, build_model, rendezvous_env

ACCUM = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring); exits 2 for a bad ``--accum``."""
    p = argparse.ArgumentParser(
        prog="python -m obshub.workloads.accum_train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps (default {STEPS})")
    p.add_argument("--hidden", type=int, default=HIDDEN, help=f"MLP hidden width (default {HIDDEN})")
    p.add_argument("--batch", type=int, default=BATCH, help=f"samples per optimizer step per rank (default {BATCH})")
    p.add_argument("--accum", type=int, default=ACCUM, help=f"micro-batches per optimizer step (default {ACCUM})")
    p.add_argument(
        "--step-sleep-ms",
        type=float,
        default=0.0,
        help="simulated data-loading time per optimizer step, ms, spread over its micro-batches (default 0)",
    )
    a = p.parse_args(argv)
    if not 1 <= a.accum <= a.batch:
        p.error(f"--accum {a.accum}: between 1 and --batch ({a.batch}) micro-batches per optimizer step")
    return a


def main(argv: list[str] | None = None) -> int:
    """Train; returns the process exit code (0; 2 when MASTER_PORT is missing with WORLD_SIZE > 1)."""
    args = parse_args(argv)
    if not rendezvous_env("accum_train"):
        return 2
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)
    model = DDP(build_model(args.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank)
    micro = args.batch // args.accum
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for m in range(args.accum):
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / args.accum / 1000)  # stands for loading this micro-batch
            x = torch.randn(micro, FEATURES, generator=gen)
            y = torch.randint(0, CLASSES, (micro,), generator=gen)
            # the gradients of the first accum-1 micro-batches stay local; the last backward all-reduces
            sync = m == args.accum - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = loss_fn(model(x), y) / args.accum
                loss.backward()
            total += loss.detach()
        dist.all_reduce(total)  # global loss for logging: a plain collective
        opt.step()
        sys.stdout.write(f"step {step} rank {rank} time_ms {(time.perf_counter() - t0) * 1000:.1f}\n")
        sys.stdout.flush()
    dist.barrier()
    del opt, model
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
