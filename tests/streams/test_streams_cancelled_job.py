"""A cancelled job is not a hang (docs/ANALYSIS.md "A job cancelled").

Found by a new user: Ctrl-C of a running ``obshub demo`` (SIGINT to every rank) fired ``rank_hang``: the
rank outside a collective died first, its peers, blocked inside gloo's all-reduce, died after it, and
the worker named the first exit as a killed rank whose peers failed on it. A job cancelled by its
scheduler (scancel, kubectl delete: SIGTERM to every rank) has the same shape. The agents now report the
signal that ended each rank (``RANK_STATE`` payload ``signal``, read from the zombie's stat); every rank
of the step's hosts ended by a stop signal (SIGHUP, SIGINT, SIGTERM) names nothing. A rank killed
otherwise (SIGKILL: the demo's ``exit`` fault, an OOM kill) is named as before, and so is a rank ended by
SIGTERM alone while its peers still wait.

The worker's logic (ingest + fold, ``streams.inproc.InProcess``) folds the synthetic batches of a 4-rank
job (the shapes of tests/streams/test_streams_ended_job.py: node2's rank ends 200 ms after the last
batch inside step 6, the others 100 ms after it) with its clock at each batch's send time."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from obshub.core import schema
from obshub.core.schema import Batch, Event, Kind
from obshub.streams import synthetic
from obshub.streams.analysis import Thresholds
from tests.streams.test_streams_ended_job import _cut_in_step_6, _feed, _killed_in_step_6
from tests.streams.test_streams_lifecycle import _end

S = 1_000_000_000


def _exit(job: str, i: int, pid: int, at_ns: int, **why) -> Batch:
    """Host ``i``'s agent reporting that process ``pid`` exited at CLOCK_REALTIME ``at_ns``, with ``why``
    (``signal=N`` or ``exit_code=N``) in the payload as the agent sends it."""
    off = synthetic._offset(i)
    ev = Event(int(Kind.RANK_STATE), at_ns - off, 0, 0, -1, pid, pid, -1, 3, {"state": "exited", **why})
    return Batch(job, f"node{i}", i, f"{job}/node{i}/a1", 0, [ev], schema.Clock(off, 20_000, 0), at_ns)


def _waiting(job: str, t0: int) -> list[Batch]:
    """Steps 0-5 and step 6; node2's rank stops before its first collective of step 6, the others reach
    that collective and wait in it."""
    return _cut_in_step_6(job, t0, waiting=frozenset({"node0", "node1", "node3"}))


def _run(job: str, first: dict, others: dict | None, until_s: float = 6) -> list[dict]:
    """Steps 0-5 and step 6 up to its first collective; node2's rank exits with ``first`` 200 ms after the
    last batch, the others with ``others`` 100 ms after it (None: they do not exit, they wait inside the
    collective). Returns the hang records of a worker checking every 250 ms for ``until_s`` after the
    last exit."""
    from obshub.streams.inproc import InProcess

    t0 = 1_800_000_000 * S
    ran = _killed_in_step_6(job, t0)[0] if others is not None else _waiting(job, t0)
    killed = _end(ran) + S // 5
    exits = [_exit(job, 2, 1002, killed, **first)]
    if others is not None:
        exits += [_exit(job, i, 1000 + i, killed + S // 10, **others) for i in (0, 1, 3)]
    seq: dict[str, int] = defaultdict(int)
    numbered = []
    for b in sorted(exits, key=lambda b: b.sent_ns):
        numbered.append(dataclasses.replace(b, seq=100 + seq[b.agent_id]))
        seq[b.agent_id] += 1
    now = [t0]
    pipe = InProcess(clock=lambda: now[0])
    _feed(pipe, now, ran, 0)
    return _feed(pipe, now, numbered, _end(numbered) + int(until_s * S))


@pytest.mark.parametrize("sig", [2, 15, 1], ids=["sigint", "sigterm", "sighup"])
def test_every_rank_ended_by_a_stop_signal_names_nothing(sig):
    """Ctrl-C (SIGINT), scancel / kubectl delete (SIGTERM), a closed terminal (SIGHUP): a job end."""
    assert _run(f"cancel{sig}", {"signal": sig}, {"signal": sig}) == []


def test_a_rank_killed_with_sigkill_whose_peers_fail_on_it_is_still_named():
    """The demo's ``exit`` fault: node2 SIGKILLed, its peers fail on the lost connection (exit code 1)."""
    named = _run("crash", {"signal": 9}, {"exit_code": 1})
    assert named and {(h["host"], h["state"]) for s in named for h in s["hang"]["hosts"]} == {("node2", "exited")}


def test_a_stop_signal_that_ended_one_rank_only_is_named_after_the_cancel_wait():
    """node2 ended by SIGTERM alone, its peers go on waiting: no cancel, named once the others had
    ``hang_cancel_wait_ns`` to end too; and a stop signal of the first rank with peers that failed on it
    (exit code 1) is named too."""
    named = _run("alone", {"signal": 15}, None, until_s=4)
    assert named and {(h["host"], h["state"]) for s in named for h in s["hang"]["hosts"]} == {("node2", "exited")}
    first = min(s["closed_at_ns"] for s in named)
    assert first >= _end(_waiting("alone", 1_800_000_000 * S)) + S // 5 + Thresholds().hang_cancel_wait_ns
    named = _run("killed-one", {"signal": 15}, {"exit_code": 1})
    assert named and {h["host"] for s in named for h in s["hang"]["hosts"]} == {"node2"}


def test_a_bad_signal_value_in_an_exit_report_counts_as_unknown():
    """A payload ``signal`` that is no signal number (out of range) is read as 0: the exit is
    judged as one with no known signal (named), never refused."""
    for bad in (300, -2, 0):
        named = _run("bad", {"signal": bad}, {"signal": bad})
        assert named, bad


def test_one_reading_of_a_process_state_for_the_cancel_wait_and_the_cancel():
    """``_stop_exits`` and ``_cancelled`` read a process state through one helper: an exit by a stop signal
    gives its receive time, anything else (a SIGKILL, a stopped process, a state without a signal) none."""
    from obshub.streams.fold import _cancelled, _stop_exit_ns, _stop_exits

    assert _stop_exit_ns(("exited", 7, 5, 15)) == 7
    for v in [("exited", 7, 5, 9), ("stopped", 7, 5, 15), ("exited", 7, 5), ("exited", 7, 5, 0)]:
        assert _stop_exit_ns(v) is None
    states = {"a": {1: ("exited", 7, 5, 2)}, "b": {2: ("exited", 9, 5, 9)}}
    assert _stop_exits({"a", "b"}, states) == [7]
    assert _cancelled({"a"}, {"a": {1: (0, 0)}}, states)
    assert not _cancelled({"a", "b"}, {"a": {1: (0, 0)}, "b": {2: (1, 0)}}, states)
