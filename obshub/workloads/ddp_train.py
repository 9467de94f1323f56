"""A real, small torch.distributed DDP training (gloo, CPU): an MLP on synthetic data.

Run under torchrun or plain python with the usual environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, ``LOCAL_RANK``; without them: one rank, a free local port)::

    torchrun --nproc-per-node 2 -m obshub.workloads.ddp_train --steps 20      # 2 ranks on this machine
    obshub run -- torchrun --nproc-per-node 2 -m obshub.workloads.ddp_train   # the same, instrumented
    python -m obshub.workloads.ddp_train --steps 5 --step-sleep-ms 30         # one rank, 30 ms "data"

Each step: synthetic data (plus ``--step-sleep-ms`` of simulated data loading), forward, loss, backward
(DDP all-reduces the gradients), an all_reduce of the loss for logging (a plain torch.distributed call),
SGD ``optimizer.step()``. One line per step on stdout: ``step N rank R time_ms T`` (T = wall time of the
step, ms). A barrier at the end, then exit 0. Sizes default to ~20-50 ms per step on a CPU core.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# defaults: ~20-50 ms per step per rank on one loaded CPU core
STEPS = 10
HIDDEN = 1024
BATCH = 128
FEATURES = 64
CLASSES = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous_env(prog: str) -> bool:
    """Fill in torch.distributed's env:// rendezvous for a run outside torchrun: ``RANK`` 0, ``WORLD_SIZE`` 1,
    ``MASTER_ADDR`` 127.0.0.1 and a free ``MASTER_PORT`` where unset. Returns False (after a line on stderr
    naming ``prog``) when ``MASTER_PORT`` is missing with ``WORLD_SIZE`` > 1: the ranks could not meet."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        if os.environ["WORLD_SIZE"] != "1":
            print(f"{prog}: MASTER_PORT must be set when WORLD_SIZE > 1", file=sys.stderr)
            return False
        os.environ["MASTER_PORT"] = str(_free_port())
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m obshub.workloads.ddp_train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps", type=int, default=STEPS, help=f"training steps (default {STEPS})")
    p.add_argument("--hidden", type=int, default=HIDDEN, help=f"MLP hidden width (default {HIDDEN})")
    p.add_argument("--batch", type=int, default=BATCH, help=f"samples per step per rank (default {BATCH})")
    p.add_argument(
        "--step-sleep-ms", type=float, default=0.0, help="simulated data-loading time per step, ms (default 0)"
    )
    return p.parse_args(argv)


def build_model(hidden: int) -> nn.Module:
    """A 3-layer MLP, FEATURES -> hidden -> hidden -> CLASSES."""
    return nn.Sequential(
        nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES)
    )


def main(argv: list[str] | None = None) -> int:
    """Train; returns the process exit code (0)."""
    args = parse_args(argv)
    if not rendezvous_env("ddp_train"):
        return 2
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)  # same initial weights everywhere (DDP broadcasts anyway)
    model = DDP(build_model(args.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank)  # each rank its own data shard
    for step in range(args.steps):
        t0 = time.perf_counter()
        if args.step_sleep_ms:
            time.sleep(args.step_sleep_ms / 1000)  # stands for data loading
        x = torch.randn(args.batch, FEATURES, generator=gen)
        y = torch.randint(0, CLASSES, (args.batch,), generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # global loss for logging: a plain collective
        opt.step()
        # one write per line, so the lines of ranks sharing a pipe never interleave
        sys.stdout.write(f"step {step} rank {rank} time_ms {(time.perf_counter() - t0) * 1000:.1f}\n")
        sys.stdout.flush()
    dist.barrier()
    # free DDP's reference to the process group while the interpreter is whole: left to the interpreter's
    # exit, gloo's threads could be torn down in the wrong order and abort the process after its last step
    del opt, model
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
