"""One life of a training job that checkpoints and resumes (tests/instrument/test_instrument_stepsource.py):
``python tests/instrument/resume_loop.py STEPS CKPT OUT.json`` with torchrun's environment. DDP on gloo,
AdamW; when CKPT exists the model and optimizer are restored from it first (``optimizer.load_state_dict``,
as a user's resume code or a framework does), then STEPS optimizer steps run and rank 0 writes CKPT.

The probe functions of :mod:`obshub.instrument.usdt` are replaced by recorders before ``enable()``; OUT
holds the probe calls and the optimizer's own step count after training.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main() -> None:
    steps, ckpt, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    import torch.distributed as dist

    from obshub.instrument import hooks, usdt

    calls: list[list] = []
    for name in usdt.PROBES:
        setattr(usdt, name, lambda *a, _n=name: calls.append([_n, *a]))
    usdt.coll_end = lambda *a: calls.append(["coll_end", *a[:6]])  # a 7th argument: the op's future
    os.environ["OBSHUB_COLLECTIVE_KERNEL"] = "python"  # the recorders replace what the Python kernel calls
    torch.set_num_threads(1)
    hooks.enable(job="resume")
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for _ in range(steps):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    if dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict()}, ckpt)
    count = int(next(iter(opt.state.values()))["step"])
    with open(out, "w") as f:
        json.dump({"calls": calls, "optimizer_steps": count}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
