"""Real frameworks' training loops, unmodified, under obshub's hooks: PyTorch Lightning (automatic
optimisation with accumulate_grad_batches=2, whose last micro-batch runs inside ``optimizer.step(closure)``;
manual optimisation, whose ``training_step`` and backward run inside the DDP module's forward),
accelerate (gradient accumulation, skipped optimizer steps), FSDP2 (``fully_shard``) and DDP under
``torch.compile``: 2 ranks on gloo/CPU, 3 optimizer steps of 2 micro-batches each (tests/instrument/loops.py).

Each asserts, on both ranks: one step per optimizer step the framework reports; per step one
forward/backward pair per micro-batch, then the optimizer phase, in that order (step 0 has no data
phase); as many forward and backward phases as the framework ran; and that every op the process
group's backend ran (its own sequence number) was seen exactly once, ended, and named the same on
both ranks. A torch path that issues collectives obshub does not see fails the last check.

The probes are read at the C probe sites (``obshub.instrument._usdt`` records them), so every loop runs
the default collective kernel, the C++ one (obshub/instrument/_c10d_kernel.cpp) when it is built; the
accelerate loop runs the Python kernel (``OBSHUB_COLLECTIVE_KERNEL=python``), so both see a framework.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.instrument import loops

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_kernel() -> str:
    """The collective kernel a rank installs by default: ``"native"`` when the C++ kernel loads."""
    try:
        from obshub.instrument import _c10d_kernel  # noqa: F401
    except ImportError:
        return "python"
    return "native"


def _run(loop: str, tmp_path: Path, world: int = 2, kernel: str | None = None) -> list[dict]:
    """Run ``loop`` on ``world`` ranks with collective kernel ``kernel`` (None: the default); the per-rank
    records of tests/instrument/loops.py, after checking each rank used that kernel. Once more on another
    port when the rendezvous port was taken between choosing and binding it (a shared machine)."""
    try:
        results = _run_once(loop, tmp_path, world, kernel)
    except _PortTaken:
        results = _run_once(loop, tmp_path, world, kernel)
    assert [r["truth"]["kernel"] for r in results] == [kernel or _default_kernel()] * world
    return results


class _PortTaken(Exception):
    pass


def _run_once(loop: str, tmp_path: Path, world: int, kernel: str | None) -> list[dict]:
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OBSHUB_", "TORCHELASTIC_", "SLURM_"))}
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            PYTHONPATH=str(REPO),
            OMP_NUM_THREADS="1",
        )
        if kernel:
            env["OBSHUB_COLLECTIVE_KERNEL"] = kernel
        cmd = [sys.executable, str(REPO / "tests/instrument/loops.py"), loop, str(tmp_path / f"{rank}.json")]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True))
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs) and any(
        "EADDRINUSE" in e or "address already in use" in e.lower() for e in errs
    ):
        raise _PortTaken(port)
    assert [p.returncode for p in procs] == [0] * world, "\n".join(e[-3000:] for e in errs)
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(world)]


def _phases_by_step(calls: list[list]) -> dict[int, list[str]]:
    """Step -> its phases in order; asserts every phase ends (with its begin's key) before the next begins."""
    out: dict[int, list[str]] = {}
    open_phase = None
    for c in calls:
        if c[0] == "phase_begin":
            assert open_phase is None, f"{c[1]} began while {open_phase} was open"
            open_phase = (c[1], c[3])
            out.setdefault(c[2], []).append(c[1])
        elif c[0] == "phase_end":
            assert open_phase == (c[1], c[3]), f"phase_end {c[1:]} does not close {open_phase}"
            open_phase = None
        elif c[0] == "step_end":
            assert open_phase is None
    return out


def _check(results: list[dict]) -> None:
    micro = ["forward", "backward"] * loops.MICRO + ["optimizer"]
    group_ops = []
    for rank, rec in enumerate(results):
        calls, truth = rec["calls"], rec["truth"]
        # steps: one per optimizer step the framework took, numbered from 0
        assert truth["optimizer_steps"] == loops.STEPS
        assert [c[1] for c in calls if c[0] == "step_end"] == list(range(loops.STEPS)), rank
        phases = _phases_by_step(calls)
        for step in range(loops.STEPS):
            assert phases[step] == (micro if step == 0 else ["data", *micro]), (rank, step, phases[step])
        assert phases[loops.STEPS] == ["data"]  # the step that never came
        names = Counter(c[1] for c in calls if c[0] == "phase_begin")
        assert (names["forward"], names["backward"]) == (truth["forward"], truth["backward"])
        # collectives: every op the backend ran, once; sequence numbers contiguous per group
        begins = [c for c in calls if c[0] == "coll_begin"]
        per_group = Counter(c[1].split(":p2p:")[0] for c in begins)
        assert dict(per_group) == {k: v for k, v in truth["backend_seq"].items() if v}, rank
        for pg in per_group:
            seqs = [c[2] for c in begins if c[1] == pg]
            assert seqs == list(range(len(seqs)))
        ends = [c for c in calls if c[0] == "coll_end"]
        assert sorted(map(tuple, ends)) == sorted(tuple(["coll_end", *c[1:]]) for c in begins)
        group_ops.append([(c[1], c[2], c[3], c[4]) for c in begins if ":p2p:" not in c[1]])
    assert all(ops == group_ops[0] for ops in group_ops)  # the same collectives, in order, on every rank


def test_lightning_automatic_optimisation_with_accumulation(tmp_path):
    results = _run("lightning_auto", tmp_path)
    _check(results)
    assert results[0]["truth"]["global_step"] == loops.STEPS


def test_lightning_manual_optimisation(tmp_path):
    _check(_run("lightning_manual", tmp_path))


def test_accelerate_loop_with_accumulation(tmp_path):
    _check(_run("accelerate", tmp_path, kernel="python"))


def test_fsdp2_gathers_and_reductions_are_seen(tmp_path):
    results = _run("fsdp2", tmp_path)
    _check(results)
    ops = Counter(c[3] for c in results[0]["calls"] if c[0] == "coll_begin" and c[5] >= 0)
    # parameters all-gathered (forward, backward), gradients reduce-scattered, inside the steps
    assert ops["all_gather_into_tensor"] > 0 and ops["reduce_scatter_tensor"] > 0


def test_compiled_ddp_all_reduces_are_seen(tmp_path):
    results = _run("ddp_compiled", tmp_path)
    _check(results)
    per_step = Counter(c[5] for c in results[0]["calls"] if c[0] == "coll_begin" and c[3] == "all_reduce")
    assert all(per_step[s] >= 1 for s in range(loops.STEPS))


def test_fsdp1_gathers_and_reductions_are_seen(tmp_path):
    _check(_run("fsdp1", tmp_path))


def test_tensor_parallel_and_point_to_point_are_seen(tmp_path):
    """DTensor's functional collectives, then send/recv and batch_isend_irecv: each p2p op counts on its
    pair, and the sender's op and the receiver's share (pair, seq)."""
    results = _run("tensor_parallel_p2p", tmp_path)
    _check(results)
    p2p = [{(c[1], c[2]): c[3] for c in rec["calls"] if c[0] == "coll_begin" and ":p2p:" in c[1]} for rec in results]
    assert set(p2p[0]) == set(p2p[1]) == {("0:p2p:0-1", s) for s in range(3)}
    assert all({p2p[0][k], p2p[1][k]} == {"send", "recv"} for k in p2p[0])
