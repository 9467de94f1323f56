"""Step numbers that follow the training's own progress (obshub/instrument/stepsource.py): a job resumed
from a checkpoint after N optimizer steps numbers its steps N, N+1, ... in the new process; the override
sources ($OBSHUB_START_STEP, ``set_step``) and which one wins; optimizers without a count (SGD).

In-process tests use the recording probes of conftest.py; the resume test runs two lives of a 2-rank DDP
job on gloo (tests/instrument/resume_loop.py) through ``torch.save`` / ``torch.load``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from obshub.core.errors import ConfigError
from obshub.instrument import stepsource

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_sources():
    stepsource.reset()
    yield
    stepsource.reset()


def _train(model, opt, n: int) -> None:
    x, y = torch.randn(2, 4), torch.randn(2, 1)
    for _ in range(n):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _ended(calls) -> list[int]:
    return [c[1] for c in calls if c[0] == "step_end"]


def _begun(calls) -> list[int]:
    return [c[1] for c in calls if c[0] == "step_begin"]


def _adam_state(n: int) -> dict:
    """The state_dict of an Adam that took ``n`` steps (made before the hooks are enabled)."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters())
    _train(model, opt, n)
    return opt.state_dict()


def test_optimizer_count_after_load_state_dict_continues_the_steps(monkeypatch, untraced):
    saved, rollback = _adam_state(4), _adam_state(2)
    from obshub.instrument import hooks

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters())
    calls: list[tuple] = []
    from obshub.instrument import usdt

    for name in usdt.PROBES:
        monkeypatch.setattr(usdt, name, lambda *a, _n=name: calls.append((_n, *a)))
    hooks.enable(job="j", host_id=1)
    try:
        opt.load_state_dict(saved)
        assert stepsource.pending() == (4, "optimizer")
        _train(model, opt, 2)
        assert _ended(calls) == [4, 5]
        # a rollback inside the open step (its data phase): that step holds optimizer step 2, the next is 3
        opt.load_state_dict(rollback)
        assert stepsource.pending() == (3, "optimizer")
        _train(model, opt, 2)
        assert _ended(calls) == [4, 5, 6, 3]
        assert _begun(calls) == [4, 5, 6, 3, 4]
        assert stepsource.applied() == [(4, "optimizer"), (3, "optimizer")]
    finally:
        hooks.disable()
        hooks._st.__init__()
        hooks._tls.__dict__.clear()
    assert "__obshub_wrapped__" not in vars(torch.optim.Optimizer.load_state_dict)  # disable() undid it


def test_set_step_wins_over_the_optimizer_and_the_environment(probes, monkeypatch):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters())
    saved = _adam_state(3)  # hooks are on: these 3 steps are numbered 0..2, step 3 is open (data)
    stepsource.propose(100, "env")
    opt.load_state_dict(saved)  # the optimizer's 3 does not replace the pending env number
    assert stepsource.pending() == (100, "env")
    from obshub.instrument import set_step

    set_step(50)  # inside open step 3: it is taken to be step 50, the next is 51
    opt.load_state_dict(saved)
    assert stepsource.pending() == (51, "set_step")
    _train(model, opt, 2)
    assert _ended(probes) == [0, 1, 2, 3, 51]
    assert _begun(probes) == [0, 1, 2, 3, 51, 52]
    with pytest.raises(ValueError, match="integer >= 0"):
        set_step(-1)
    with pytest.raises(ValueError, match="integer >= 0"):
        set_step(True)


def test_sgd_has_no_count_and_steps_count_on(probes):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, opt, 2)
    opt.load_state_dict(opt.state_dict())  # momentum buffers, no "step"
    assert stepsource.optimizer_step_count(opt) is None and stepsource.pending() is None
    _train(model, opt, 1)
    assert _ended(probes) == [0, 1, 2]


def test_start_step_from_the_environment():
    assert stepsource.start_step_from_env({}) is None
    assert stepsource.start_step_from_env({"OBSHUB_START_STEP": " "}) is None
    assert stepsource.start_step_from_env({"OBSHUB_START_STEP": "1200"}) == 1200
    for bad in ("-3", "1.5", "ten"):
        with pytest.raises(ConfigError, match="OBSHUB_START_STEP"):
            stepsource.start_step_from_env({"OBSHUB_START_STEP": bad})


def test_enable_applies_start_step_and_rejects_a_bad_one(monkeypatch, untraced):
    from obshub.instrument import hooks

    monkeypatch.setenv("OBSHUB_START_STEP", "x")
    with pytest.raises(ConfigError, match="OBSHUB_START_STEP"):
        hooks.enable(job="j", host_id=1)
    assert not hooks.is_enabled() and not hooks._st.undo
    monkeypatch.setenv("OBSHUB_START_STEP", "7")
    hooks.enable(job="j", host_id=1)
    try:
        assert stepsource.pending() == (7, "env")
    finally:
        hooks.disable()
        hooks._st.__init__()


def test_optimizer_step_count_reads_tensors_and_numbers():
    class Opt:
        state = {1: {"step": torch.tensor(9.0)}, 2: {"step": 11}, 3: {"exp_avg": 0}}

    assert stepsource.optimizer_step_count(Opt()) == 11
    Opt.state = {1: {"step": float("nan")}}
    assert stepsource.optimizer_step_count(Opt()) is None
    Opt.state = {}
    assert stepsource.optimizer_step_count(Opt()) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _life(steps: int, ckpt: Path, tmp_path: Path, name: str, world: int = 2) -> list[dict]:
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
        out = tmp_path / f"{name}-{rank}.json"
        cmd = [sys.executable, str(REPO / "tests/instrument/resume_loop.py"), str(steps), str(ckpt), str(out)]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True))
    try:
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(e[-3000:] for e in errs)
    return [json.loads((tmp_path / f"{name}-{rank}.json").read_text()) for rank in range(world)]


@pytest.mark.torch
def test_a_job_resumed_from_a_checkpoint_continues_its_step_count(probes, tmp_path):
    """Train 5 steps (this process, the first life) and checkpoint; new processes (2 ranks, DDP on gloo)
    load it and train 3 more: their steps are 5, 6, 7."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for _ in range(5):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    assert _ended(probes) == [0, 1, 2, 3, 4]
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt)
    resumed = _life(3, ckpt, tmp_path, "life1")
    for rank in range(2):
        calls = resumed[rank]["calls"]
        assert _ended(calls) == [5, 6, 7], rank
        assert _begun(calls) == [5, 6, 7, 8], rank  # the loop ended in step 8's data phase
        assert resumed[rank]["optimizer_steps"] == 8
        # every phase and collective of the new life is keyed to its step (TraceKey step field)
        keyed = [c for c in calls if c[0] in ("phase_begin", "coll_begin")]
        assert keyed and all(c[-1] >> 32 & 0xFFFF == c[-2] for c in keyed if c[-2] >= 0), rank
        assert any(c[0] == "coll_begin" and c[-2] == 5 for c in calls), rank  # DDP's all-reduce in step 5
