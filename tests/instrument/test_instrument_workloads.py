"""The demo's framework workloads (``obshub demo --workload lightning|accum``; ``ddp``, the default, is every e2e demo's) under ``obshub run``, started
as the demo starts them (``parts.training_argv``: the module, ``--steps``, ``--step-sleep-ms``; 2 ranks of one
host: ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``), gloo on CPU, every probe recorded
(tests/instrument/workload_probe.py).

Each asserts, on both ranks, that obshub's steps are the workload's own optimizer steps: one ``step_end``
per ``step N rank R`` line the workload printed, numbered alike (a micro-batch of gradient accumulation or a
Lightning hook counted as a step would shift them); per step the phases the loop ran (accum: 4
forward/backward pairs then the optimizer; Lightning: its closure's forward and backward then the
optimizer); and, for accum, that the gradient all-reduce runs only in the last micro-batch's backward
(``no_sync`` on the first three), so the step's collectives are where the step's network time is.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from obshub.demo import parts
from obshub.demo.cluster import Host

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
STEPS = 5
STEP_LINE = re.compile(r"^step (\d+) rank (\d+) time_ms ([\d.]+)$", re.M)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(workload: str, tmp_path: Path, world: int = 2) -> list[dict]:
    """The demo's command line of ``workload`` with the recording wrapper in place of ``-m MODULE``: per
    rank ``{"calls": [...], "lines": [(step, rank), ...]}``."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        argv = parts.training_argv("wl-test", Host(0), STEPS, step_sleep_ms=10.0, workload=workload)
        i = argv.index("-m", argv.index("--"))
        module = argv[i + 1]
        out = tmp_path / f"{workload}-{rank}.json"
        argv[i : i + 2] = [str(REPO / "tests/instrument/workload_probe.py"), str(out), module]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OBSHUB_", "TORCHELASTIC_", "SLURM_"))}
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            PYTHONPATH=str(REPO),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(e[-3000:] for _o, e in outs)
    results = []
    for rank, (stdout, _err) in enumerate(outs):
        rec = json.loads((tmp_path / f"{workload}-{rank}.json").read_text())
        rec["lines"] = [(int(m[1]), int(m[2])) for m in STEP_LINE.finditer(stdout)]
        results.append(rec)
    return results


def _steps(calls: list[list]) -> dict[int, list[list]]:
    """Step -> the phase begins and collective begins inside it, in order."""
    out: dict[int, list[list]] = {}
    step = None
    for c in calls:
        if c[0] == "step_begin":
            step = c[1]
        elif c[0] in ("phase_begin", "coll_begin") and step is not None:
            out.setdefault(step, []).append(c)
    return out


def _check_steps(results: list[dict]) -> dict[int, list[list]]:
    """Asserts one obshub step per printed optimizer step on every rank; returns rank 0's steps."""
    for rank, rec in enumerate(results):
        assert rec["lines"] == [(s, rank) for s in range(STEPS)], rank
        ends = [c[1] for c in rec["calls"] if c[0] == "step_end"]
        assert ends == list(range(STEPS)), (rank, ends)
        reg = [c for c in rec["calls"] if c[0] == "register"]
        assert reg, rank
    return _steps(results[0]["calls"])


def _phases(items: list[list]) -> list[str]:
    return [c[1] for c in items if c[0] == "phase_begin"]


def test_accum_workload_counts_one_step_per_optimizer_step_not_per_micro_batch(tmp_path):
    results = _run("accum", tmp_path)
    steps = _check_steps(results)
    for s in range(1, STEPS):
        assert _phases(steps[s]) == ["data", *["forward", "backward"] * 4, "optimizer"], (s, _phases(steps[s]))
        # every collective of the step in the last micro-batch's backward (phase 8: data, 4 x forward/backward):
        # the gradient all-reduce (no_sync on the first three), then the logged loss's all_reduce
        at, where = -1, []
        for c in steps[s]:
            at += c[0] == "phase_begin"
            if c[0] == "coll_begin":
                where.append(at)
        # (step 1's first forward also broadcasts DDP's rebuilt bucket order, once per job: phase 1)
        assert where and set(where) - ({1} if s == 1 else set()) == {8}, (s, where)


def test_lightning_workload_steps_are_its_global_steps(tmp_path):
    steps = _check_steps(_run("lightning", tmp_path))
    for s in range(1, STEPS):
        ph = _phases(steps[s])
        # Lightning's automatic optimisation: the closure's forward and backward inside optimizer.step()
        assert ph[0] == "data" and ph.count("forward") == 1 and ph.count("backward") == 1, (s, ph)
        assert ph.index("forward") < ph.index("backward") < len(ph) - 1 - ph[::-1].index("optimizer"), (s, ph)
        assert any(c[0] == "coll_begin" for c in steps[s]), s  # DDP's gradient all-reduce, sync_dist's
