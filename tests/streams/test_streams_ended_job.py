"""A job that ended before the worker started is never named hung (docs/ANALYSIS.md "Hangs").

Found by a new user: a demo's stream worker (its group shared by every demo run) resumed the previous
demo's job, whose ranks the demo had stopped mid-step: the old worker stopped before it read the agents'
exit reports, the new one read them from its group's committed offsets, found the step open in its
changelog, and its rule engine paged ``rank_hang`` for the dead job to every sink.

Here the worker's logic (ingest + fold, ``streams.inproc.InProcess``) folds the synthetic batches of a
4-rank job (real shapes: registrations with pids, steps, ``RANK_STATE`` exits) with its clock at each
batch's send time; the ranks are stopped inside step 6 (node2's first, the others 100 ms later, inside
the step's forward). A worker that reads the exits live names node2 (a killed rank whose peers fail on
it: the crash is paged); a worker recovered from the first one's changelog that reads the same exits
after it started names nothing, also when the exits are far younger than ``hang_hold_ns``."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from obshub.core import schema
from obshub.core.schema import Batch, Kind
from obshub.streams.inproc import InProcess
from tests.streams.test_streams_lifecycle import TICK, _end, _exit, _life, _rt

S = 1_000_000_000


def _cut_in_step_6(job: str, t0: int, waiting: frozenset[str] = frozenset()) -> list[Batch]:
    """The batches of steps 0-5 of 4 ranks (pids 1000-1003) and of step 6 up to its first collective: each
    rank ended its forward; the ranks of hosts in ``waiting`` also entered that collective (they wait in it)."""
    out = []
    for b in _life(job, 4, 7, 0, 1000, t0):
        step = max((e.step for e in b.events), default=-1)
        if step < 6:
            out.append(b)
        elif b.events[0].kind == Kind.STEP_BEGIN:
            k = next(k for k, e in enumerate(b.events) if e.kind == Kind.COLLECTIVE_BEGIN)
            keep = b.events[: k + 1 if b.host in waiting else k]
            out.append(dataclasses.replace(b, events=keep, sent_ns=_rt(b, keep[-1])))
    return out


def _killed_in_step_6(job: str, t0: int) -> tuple[list[Batch], list[Batch]]:
    """Steps 0-5 of 4 ranks (pids 1000-1003), then step 6 up to its first collective (each rank ended
    its forward); node2's rank exits 200 ms after the last batch, the others 100 ms after it. Returns
    (the batches up to the stop, the four exits)."""
    out = _cut_in_step_6(job, t0)
    killed = _end(out) + S // 5
    exits = [_exit(job, 2, 1002, killed)] + [_exit(job, i, 1000 + i, killed + S // 10) for i in (0, 1, 3)]
    seq: dict[str, int] = defaultdict(int)  # each agent numbers its batches in send order
    numbered = []
    for b in sorted(out + exits, key=lambda b: b.sent_ns):
        numbered.append(dataclasses.replace(b, seq=seq[b.agent_id]))
        seq[b.agent_id] += 1
    n = len(out)
    return numbered[:n], numbered[n:]


def _feed(pipe: InProcess, now: list[int], batches: list[Batch], until: int) -> list[dict]:
    """Feed ``batches`` in send order with the clock at each send time, checking hangs every 250 ms up
    to ``until`` ns; returns the hang records."""
    hangs = []
    for b in sorted(batches, key=lambda b: b.sent_ns):
        now[0] = max(now[0], b.sent_ns)
        pipe.feed(schema.encode_batch(b))
        hangs += [s for _sk, s, _first in pipe.fold.hangs()]
    while now[0] < until:
        now[0] += TICK
        hangs += [s for _sk, s, _first in pipe.fold.hangs()]
    return hangs


def test_a_worker_that_reads_an_ended_jobs_exits_after_it_started_names_nothing():
    t0 = 1_800_000_000 * S
    ran, exits = _killed_in_step_6("ended", t0)
    last = _end(exits)

    # the live worker reads the exits as they happen: node2 exited first inside the step, it is named
    now = [t0]
    live = InProcess(clock=lambda: now[0])
    _feed(live, now, ran, 0)
    before = {k: t.recovered() for k, t in live.tables.items()}  # its changelog before the exits
    named = _feed(live, now, exits, last + 5 * S)
    assert named and {(h["host"], h["state"]) for s in named for h in s["hang"]["hosts"]} == {("node2", "exited")}

    # the old worker stopped before it read the exits; the next one starts 30 s later (within
    # hang_hold_ns) on its changelog: the step is open, the exits arrive from the committed offsets
    for delay_s in (30, 20 * 60):
        now = [last + delay_s * S]
        later = InProcess(clock=lambda now=now: now[0], tables={k: t.recovered() for k, t in before.items()})
        assert [sk for sk, _st in later.fold.open_steps()] == ["ended|6"]
        assert _feed(later, now, exits, now[0] + 10 * S) == [], delay_s
