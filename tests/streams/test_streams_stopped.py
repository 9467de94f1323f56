"""A rank the kernel saw stopped (SCHED_OFFCPU of state T/t: SIGSTOP, a debugger) reaches the step summary's
``stopped`` with its rank, through the same join and analysis as the worker (synthetic batches ->
streams.offline), and names the step's culprit (docs/ANALYSIS.md "Culprit of a step"); a preempted or
sleeping thread's off-CPU time never counts as a stop."""

from __future__ import annotations

import dataclasses

from obshub.core.schema import Event, Kind
from obshub.streams import accumulate, offline, synthetic

STOP_STEP = 24


def _with_offcpu(batches, host_id: int, pid: int, step: int, offs: list[tuple[int, int]]):
    """``batches`` with SCHED_OFFCPU events ``(duration ns, state)`` of process ``pid`` of host
    ``host_id`` added to its first batch that holds an event of ``step``."""
    out, done = [], False
    for b in batches:
        mine = [e for e in b.events if e.step == step and e.pid == pid]
        if not done and b.host_id == host_id and mine:
            e0 = mine[0]
            extra = [
                Event(Kind.SCHED_OFFCPU, e0.ts_ns + 1 + i, d, e0.trace_key, step, pid, pid + 7, -1, state, None)
                for i, (d, state) in enumerate(offs)
            ]
            b = dataclasses.replace(b, events=sorted([*b.events, *extra], key=lambda e: e.ts_ns))
            done = True
        out.append(b)
    assert done
    return out


def test_a_stopped_rank_reaches_the_summary_with_its_rank_and_is_the_step_culprit():
    scn = synthetic.Scenario(job="llm", hosts=8, steps=32, seed=3)
    batches = [b for _, b in synthetic.generate_ranks(scn, 2)]
    # host 1's local rank 1 (global rank 3) stopped 640 ms by two threads; its local rank 0 preempted
    # 900 ms and asleep (state S = 1) 2 s: neither is a stop
    batches = _with_offcpu(batches, 1, 1001, STOP_STEP, [(640_000_000, 0x4), (410_000_000, 0x4), (3_000, 0x8)])
    batches = _with_offcpu(batches, 1, 1000, STOP_STEP, [(900_000_000, 0), (2_000_000_000, 0x1)])
    sums = offline.summarize_batches(batches)
    s = sums[("llm", STOP_STEP)]
    assert s["stopped"] == {"node1": {"ns": 640_000_000, "rank": 3}}, s["stopped"]
    c = s["culprit"]
    assert (c["host"], c["layer"], c["source"], c["rank"]) == ("node1", "process", "stopped", 3), c
    # every other step stops nothing and has no such culprit
    assert all(v["stopped"] == {} for (_j, st), v in sums.items() if st != STOP_STEP)
    assert not any((v["culprit"] or {}).get("source") == "stopped" for (_j, st), v in sums.items() if st != STOP_STEP)


def test_stopped_ns_is_the_longest_stop_and_merges_as_a_maximum():
    a, b = accumulate.new_acc("h", 0), accumulate.new_acc("h", 0)
    accumulate.add_event(a, Event(Kind.SCHED_OFFCPU, 1, 300, 0, 5, 1, 1, -1, 0x4, None), 0)
    accumulate.add_event(a, Event(Kind.SCHED_OFFCPU, 2, 200, 0, 5, 1, 2, -1, 0x4, None), 0)
    accumulate.add_event(b, Event(Kind.SCHED_OFFCPU, 3, 500, 0, 5, 1, 3, -1, 0x8, None), 0)
    accumulate.add_event(b, Event(Kind.SCHED_OFFCPU, 4, 9_000, 0, 5, 1, 4, -1, 0, None), 0)  # preempted
    assert a["stopped_ns"] == 300 and b["stopped_ns"] == 500
    assert accumulate.merge(a, b)["stopped_ns"] == 500
    assert a["layers"]["sched"][0] == 9_000  # the preempted wait stays the sched layer's, as before
    assert "stopped_ns" not in accumulate.merge(accumulate.new_acc("h", 0), accumulate.new_acc("h", 0))


def test_a_starved_thread_without_a_tracekey_is_charged_to_the_step_it_waited_in():
    # gloo's I/O thread (no TraceKey: step -1) waited 700 ms runnable inside step 5's collective (a CPU
    # burst on its host): its SCHED_RUNQ counts in step 5's sched layer, host and rank row
    from obshub.core.schema import Batch

    ev = [
        Event(Kind.STEP_BEGIN, 1_000, 0, 9, 5, 1001, 1001, -1, 5, None),
        Event(Kind.SCHED_RUNQ, 800_000_000, 700_000_000, 0, -1, 1001, 1044, -1, 1, None),
        Event(Kind.SCHED_OFFCPU, 800_000_001, 760_000_000, 0, -1, 1001, 1045, -1, 0x4, None),
        Event(Kind.STEP_END, 900_000_000, 899_999_000, 9, 5, 1001, 1001, -1, 5, None),
        Event(Kind.STEP_BEGIN, 900_001_000, 0, 10, 6, 1000, 1000, -1, 6, None),  # the other rank, next step
    ]
    out = accumulate.reduce_batch(Batch("j", "h", 0, "j/h/a", 0, ev), ranks={1000: (0, 0), 1001: (1, 1)})
    assert out[5]["layers"]["sched"][0] == 700_000_000 and out[5]["stopped_ns"] == 760_000_000
    row = out[5]["ranks"]["1"]
    assert row["layers"]["sched"][0] == 700_000_000 and row["stopped_ns"] == 760_000_000
    assert "sched" not in out[6]["layers"]
