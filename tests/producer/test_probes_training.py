"""The probes on a real 2-rank DDP training (torch.distributed, gloo) started under `obshub run`
(seen from the event source): both ranks register and are watched in the
kernel; step begin/end from both; collectives with the same (process group, sequence number) on both
ranks; every scheduler event of a rank's training thread inside a step carries that step's TraceKey
(100%); per-step scheduler sums for every step."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from obshub.core.schema import Kind, parse_trace_key
from obshub.producer.probes import Target
from tests.support.probes_util import REPO, event_source, need_bpf

pytestmark = [pytest.mark.bpf, pytest.mark.torch]
STEPS = 4


def test_two_rank_training_tracekeys(tmp_path):
    need_bpf()
    pytest.importorskip("torch")
    try:
        from obshub.instrument import usdt
    except Exception as exc:
        pytest.skip(f"obshub.instrument._usdt not built: {exc}")
    from tests.conftest import free_port_pair

    job = f"probes-{uuid.uuid4().hex[:8]}"
    cmd = [
        sys.executable,
        "-m",
        "obshub.cli",
        "run",
        "--job",
        job,
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port_pair()),
        "-m",
        "obshub.workloads.ddp_train",
        "--steps",
        str(STEPS),
    ]
    events = []
    with event_source(
        tmp_path,
        Target(registered=True),
        probes=("pytorch", "sched"),
        usdt_library=usdt.library_path(),
        thresholds={"runq_ns": 0, "offcpu_ns": 0},
    ) as (src, table):
        assert all(s.attached for s in table), table
        wl = subprocess.Popen(
            cmd,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 240
            rings: dict[int, dict[str, int]] = {}  # the ranks' collective rings the agent read
            delays: list[int] = []  # ns from a collective's end to the poll that returned it
            while wl.poll() is None and time.monotonic() < deadline:
                got = src.poll(50)
                now = time.monotonic_ns()
                delays += [now - e.ts_ns for e in got if e.kind == Kind.COLLECTIVE_END]
                events += got
                rings.update(src.coll_rings())
            events += src.poll(0)
            ring_totals = src.coll_ring_totals()  # obshub_agent_coll_ring_records_total / _drops_total
            out, err = wl.communicate(timeout=10)
        finally:
            if wl.poll() is None:
                wl.kill()
                wl.wait()
        regs = [r for r in src.registrations() if r["job"] == job]
        lost = src.lost()
    assert wl.returncode == 0, err[-3000:]
    assert sorted(r["rank"] for r in regs) == [0, 1] and all(r["world_size"] == 2 for r in regs), regs
    colls = {}
    checked = 0
    for r in regs:
        pid, rank = r["pid"], r["rank"]
        mine = [e for e in events if e.pid == pid]
        begins = {e.step: e for e in mine if e.kind == Kind.STEP_BEGIN}
        ends = {e.step: e for e in mine if e.kind == Kind.STEP_END}
        assert set(range(STEPS)) <= set(ends) <= set(begins), (rank, sorted(begins), sorted(ends))
        colls[rank] = {(e.payload["pg"], e.payload["coll_seq"]) for e in mine if e.kind == Kind.COLLECTIVE_END}
        # every collective's begin and end pair up (one `coll` trap, or the coll_begin/coll_end pair): same
        # step, key and bytes; the end's duration is the time from its begin
        cb = {(e.payload["pg"], e.payload["coll_seq"]): e for e in mine if e.kind == Kind.COLLECTIVE_BEGIN}
        for e in (e for e in mine if e.kind == Kind.COLLECTIVE_END):
            b = cb[(e.payload["pg"], e.payload["coll_seq"])]
            assert (b.step, b.trace_key, b.value) == (e.step, e.trace_key, e.value), (rank, b, e)
            assert e.duration_ns == e.ts_ns - b.ts_ns > 0, (rank, b, e)
        train_tid = begins[0].tid
        # singles (a SCHED_RUNQ of value -1 is the step's sum of the other threads' waits, sent at step_end
        # like SCHED_STEP_SUM, at the instant the next step begins)
        sched = [
            e
            for e in mine
            if e.kind in (Kind.SCHED_OFFCPU, Kind.SCHED_RUNQ)
            and e.tid == train_tid
            and not (e.kind == Kind.SCHED_RUNQ and e.value == -1)
        ]
        sums = {e.step for e in mine if e.kind == Kind.SCHED_STEP_SUM}
        assert set(range(STEPS)) <= sums, (rank, sorted(sums))
        for s in range(STEPS):
            lo, hi = begins[s].ts_ns, ends[s].ts_ns
            for e in (e for e in sched if lo <= e.ts_ns <= hi):
                parts = parse_trace_key(e.trace_key)
                assert e.step == s and parts.step16 == s & 0xFFFF, (rank, s, e)
                assert parts.host_id == r["host_id"], (rank, e)
                checked += 1
    assert colls[0] and colls[0] == colls[1], colls
    # the collectives came through each rank's collective ring (no trap), none sent by trap for lack of room
    assert all(rings.get(r["pid"], {}).get("written", 0) > 0 for r in regs), rings
    assert all(rings[r["pid"]]["drops"] == 0 for r in regs), rings
    # the agent's counters of them: every record written was read (a collective before the ring was opened
    # came by trap), none dropped
    n_coll = sum(1 for e in events if e.kind in (Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END))
    assert sum(rings[r["pid"]]["written"] for r in regs) <= ring_totals[0] <= n_coll, (ring_totals, n_coll, rings)
    assert ring_totals[1] == 0, ring_totals
    # drained at every poll: a collective's END reaches the reader within a poll (50 ms here), far inside the
    # 2 s after which the kernel would take the trap path again
    delays.sort()
    assert delays and delays[-1] < 2_000_000_000, delays[-5:]
    print(f"END -> poll: median {delays[len(delays) // 2] / 1e6:.1f} ms, max {delays[-1] / 1e6:.1f} ms")
    assert checked >= 2 * STEPS, checked  # every step had scheduler events on the training thread
    print(f"checked {checked} scheduler events inside steps; lost {lost}")
