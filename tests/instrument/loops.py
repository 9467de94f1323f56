"""Training loops of real frameworks, run unmodified under obshub's hooks (one process per rank, gloo on
CPU): ``python tests/instrument/loops.py LOOP OUT.json`` with torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

The probe sites of :mod:`obshub.instrument.usdt` record every probe fired (``_usdt._record``: from the
hooks' Python and from the collective kernel, the C++ one unless ``OBSHUB_COLLECTIVE_KERNEL`` says
otherwise, in firing order), so the file holds every probe call (``calls``) and the kernel that fired
the collectives (``truth["kernel"]``) next to what the framework and the process group
report themselves (``truth``): optimizer steps, forward/backward calls, and each process group's backend
sequence number (the number of collective and point-to-point ops the backend ran).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

MICRO = 2  # micro-batches per optimizer step (gradient accumulation)
STEPS = 3  # optimizer steps per loop
BATCH = 4


def _data(n_batches: int):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_batches * BATCH, 8, generator=g)
    y = torch.randn(n_batches * BATCH, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


class _Counter:
    """What the framework did, counted by the framework's own callbacks or by the loop itself."""

    def __init__(self) -> None:
        self.forward = 0
        self.backward = 0
        self.optimizer_steps = 0


def lightning(manual: bool) -> dict:
    """PyTorch Lightning 2.x, DDP strategy on CPU: automatic optimisation with accumulate_grad_batches=2
    (the last micro-batch's forward and backward run inside ``optimizer.step(closure)``), or manual
    optimisation (``training_step`` runs inside the DDP module's forward, ``manual_backward`` there too)."""
    import lightning as L

    count = _Counter()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            count.forward += 1
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            if not manual:
                return loss
            opt = self.optimizers()
            self.manual_backward(loss / MICRO)
            if (batch_idx + 1) % MICRO == 0:
                opt.step()
                opt.zero_grad()
            return None

        def on_after_backward(self) -> None:
            count.backward += 1

        def on_before_optimizer_step(self, optimizer) -> None:
            count.optimizer_steps += 1

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    world = int(os.environ["WORLD_SIZE"])
    loader = torch.utils.data.DataLoader(_data(MICRO * STEPS * world), batch_size=BATCH)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp",
        max_epochs=1,
        accumulate_grad_batches=1 if manual else MICRO,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), loader)
    return {
        "forward": count.forward,
        "backward": count.backward,
        "optimizer_steps": trainer.global_step if not manual else count.optimizer_steps,
        "global_step": trainer.global_step,
    }


def _init() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")


def _plain_loop(model: torch.nn.Module, count: _Counter) -> None:
    """A plain PyTorch loop with gradient accumulation: MICRO forward/backward per optimizer step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = _data(MICRO * STEPS)
    for step in range(STEPS):
        for micro in range(MICRO):
            x, y = data[(step * MICRO + micro) * BATCH : (step * MICRO + micro + 1) * BATCH]
            loss = torch.nn.functional.mse_loss(model(x), y)
            count.forward += 1
            loss.backward()
            count.backward += 1
        opt.step()
        opt.zero_grad()
        count.optimizer_steps += 1


def fsdp2() -> dict:
    """FSDP2 (``fully_shard``) on gloo: parameters all-gathered before forward and backward, gradients
    reduce-scattered (``all_gather_single`` / ``reduce_scatter_single`` in this torch)."""
    from torch.distributed.fsdp import fully_shard

    _init()
    torch.manual_seed(0)
    model = _mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    count = _Counter()
    _plain_loop(model, count)
    return vars(count)


def ddp_compiled() -> dict:
    """DDP under ``torch.compile`` (inductor on CPU: needs gcc): the reducer's all-reduces run from
    compiled code (DDPOptimizer splits the graph at bucket boundaries)."""
    _init()
    torch.manual_seed(0)
    model = torch.compile(torch.nn.parallel.DistributedDataParallel(_mlp()))
    count = _Counter()
    _plain_loop(model, count)
    return vars(count)


def accelerate() -> dict:
    """An accelerate loop: ``Accelerator(gradient_accumulation_steps=2)``, ``accelerator.accumulate``,
    ``accelerator.backward``; the prepared optimizer skips ``step()`` on non-sync micro-batches."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=True, gradient_accumulation_steps=MICRO)
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    world = int(os.environ["WORLD_SIZE"])
    loader = torch.utils.data.DataLoader(_data(MICRO * STEPS * world), batch_size=BATCH)
    model, opt, loader = acc.prepare(model, opt, loader)
    count = _Counter()
    for x, y in loader:
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            count.forward += 1
            acc.backward(loss)
            count.backward += 1
            opt.step()
            if acc.sync_gradients:
                count.optimizer_steps += 1
            opt.zero_grad()
    return vars(count)


def fsdp1() -> dict:
    """FSDP1 (``FullyShardedDataParallel``) on CPU/gloo, every Linear its own unit."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    _init()
    torch.manual_seed(0)
    model = FSDP(_mlp(), auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), device_id=torch.device("cpu"))
    count = _Counter()
    _plain_loop(model, count)
    return vars(count)


def tensor_parallel_p2p() -> dict:
    """Tensor parallel (DTensor: column- then row-wise sharded Linear layers, their collectives issued as
    functional collectives), then a pipeline-style hand-over of activations: ``dist.send``/``recv`` and
    ``batch_isend_irecv``, and a gather and a scatter (whose non-root ranks pass no list)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _init()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(_mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    count = _Counter()
    _plain_loop(model, count)
    rank, act = dist.get_rank(), torch.ones(BATCH, 16)
    if rank == 0:
        dist.send(act, dst=1)
        ops = [dist.P2POp(dist.isend, act, 1), dist.P2POp(dist.irecv, torch.empty_like(act), 1)]
    else:
        dist.recv(act, src=0)
        ops = [dist.P2POp(dist.irecv, torch.empty_like(act), 0), dist.P2POp(dist.isend, act, 0)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    # rooted collectives: the non-root rank passes no list
    dist.gather(act, [torch.empty_like(act) for _ in range(2)] if rank == 0 else None, dst=0)
    dist.scatter(act, [torch.ones_like(act)] * 2 if rank == 1 else None, src=1)
    return vars(count)


LOOPS = {
    "fsdp1": fsdp1,
    "tensor_parallel_p2p": tensor_parallel_p2p,
    "lightning_auto": lambda: lightning(manual=False),
    "lightning_manual": lambda: lightning(manual=True),
    "fsdp2": fsdp2,
    "ddp_compiled": ddp_compiled,
    "accelerate": accelerate,
}


def _backend_seqs() -> dict[str, int]:
    """Per process group name: the backend's sequence number (ops it ran)."""
    import torch.distributed.distributed_c10d as c10d

    out = {}
    for pg, name in c10d._world.pg_names.items():
        out[name] = pg._get_backend(torch.device("cpu"))._get_sequence_number_for_group()
    return out


def main() -> None:
    loop, out = sys.argv[1], sys.argv[2]
    import torch.distributed as dist

    from obshub.instrument import hooks, usdt

    # every probe the sites fire, from the hooks' Python and from the collective kernel (the C++ one by
    # default, on gloo's threads too), in firing order: the recording of obshub.instrument._usdt
    # (OBSHUB_COLLECTIVE_KERNEL from the test picks the kernel; unset: the default)
    usdt._usdt._record(True)
    # the untraced path whatever else runs on this machine: an agent following every registered process
    # would attach to this process's copy of the extension and turn on the merged probes (as the fixture
    # `untraced` of conftest.py does for the in-process tests)
    real_sites = {usdt.probe_site(n) for n in ("register", "phase_next", "step_next", "coll")} - {None}
    site_traced = usdt.site_traced
    usdt.site_traced = lambda address: address not in real_sites and site_traced(address)
    calls: list[list] = []
    torch.set_num_threads(1)
    hooks.enable(job="loops")
    usdt._usdt._set_coll_site(0)  # the C++ kernel reads its site itself: no site, no merged collective probe
    truth = LOOPS[loop]()
    truth["backend_seq"] = _backend_seqs()
    truth["kernel"] = hooks.collective_kernel()
    deadline = time.monotonic() + 20  # coll_end runs as a done-callback, perhaps on a gloo thread
    while time.monotonic() < deadline:
        calls += [list(c) for c in usdt._usdt._recorded()]
        ends = sum(1 for c in calls if c[0] == "coll_end")
        if ends >= sum(1 for c in calls if c[0] == "coll_begin"):
            break
        time.sleep(0.01)
    with open(out, "w") as f:
        json.dump({"calls": list(calls), "truth": truth}, f)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The record is written and the group destroyed: leave without the interpreter's teardown, where a
    # framework object still holding the group (a DeviceMesh, a compiled graph) lets gloo's threads be
    # destroyed while they run ("terminate called without an active exception", SIGABRT).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
