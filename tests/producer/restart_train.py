"""One torchrun worker of tests/producer/test_agent_restart.py: DDP on gloo, AdamW, steps to STEPS-1.
Every step rank 0 writes a checkpoint (atomically) and the ranks meet at a barrier; a worker of a restarted
group loads it first (``optimizer.load_state_dict``: its steps continue from the checkpoint's count). In
the first life (``TORCHELASTIC_RESTART_COUNT`` 0) rank 1 kills itself (SIGKILL) at the start of step
KILL_AT, after the barrier of the step before, so torchrun restarts the group.

``python restart_train.py DIR`` under torchrun, with the ``obshub run`` bootstrap on PYTHONPATH; it waits
for DIR/go before it joins the group (the agent compiles its probes meanwhile)."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

STEPS = 8
KILL_AT = 4


def main() -> None:
    work = sys.argv[1]
    ckpt = os.path.join(work, "ckpt.pt")
    while not os.path.exists(os.path.join(work, "go")):
        time.sleep(0.05)
    life = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # torchrun's store outlives a restart: the default group's keys of life 0 (its ranks' gloo addresses)
    # are still there, and a life-1 rank that reads a dead peer's address fails to connect (seen on torch
    # 2.15 without obshub too, about one run in two). A prefix per life keeps the lives apart.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", store=dist.PrefixStore(f"life{life}", store), rank=rank, world_size=world)
    with open(os.path.join(work, f"pid-{life}-{rank}"), "w") as f:
        f.write(f"{os.getpid()} {os.environ['TORCHELASTIC_RUN_ID']}")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["done"]
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for step in range(start, STEPS):
        if life == 0 and rank == 1 and step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            state = {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "done": step + 1}
            torch.save(state, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        dist.barrier()
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
