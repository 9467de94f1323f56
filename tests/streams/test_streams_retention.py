"""Retention of the stream worker's per-job state (docs/STREAMS.md "Retention"), without a broker
(``streams.inproc``: the worker's ingest and fold code over tables that record every write and delete like
a changelog): a job without data for the retention loses every table record and every in-memory map, its
deletes are tombstones (a restart recovers only the live job), and a live job keeps its state and goes on
being summarised."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from obshub.core import schema
from obshub.streams import synthetic
from obshub.streams.inproc import InProcess

RETENTION_NS = 60_000_000_000


def _job(name: str, steps: int = 4, hosts: int = 3) -> list[bytes]:
    scn = synthetic.Scenario(job=name, hosts=hosts, steps=steps, seed=5)
    return [schema.encode_batch(b) for _k, b in synthetic.generate(scn)]


def _keys_of(pipe: InProcess, job: str) -> dict[str, list[str]]:
    """Table -> its keys naming ``job`` (agents: the records of the job's agent instances)."""
    out = {}
    for name, t in pipe.tables.items():
        if name == "agents":
            continue
        keys = [k for k in t if k.startswith(f"{job}@") or k.startswith(f"{job}|")]
        if keys:
            out[name] = keys
    return out


def _memory_of(pipe: InProcess, job: str) -> list[str]:
    f = pipe.fold
    maps = {
        "active_ns": f.active_ns,
        "last_seen": f.last_seen,
        "top_step": f.top_step,
        "net_recent": f.net_recent,
        "net_directed": f.net_directed,
        "quiet_until": f.quiet_until,
        "rank_state": f.rank_state,
    }
    return [name for name, m in maps.items() if job in m]


def _sweep(pipe: InProcess) -> list[tuple[str, int]]:
    """What the worker's expire timer does: a ``drop`` message into each expired job's partition."""
    expired = pipe.fold.expired_jobs()
    for job, p in expired:
        pipe._apply({"t": "drop", "job": job}, p)
    pipe.fold.forget_jobs()
    return expired


def _pipe(now: list[int]) -> InProcess:
    pipe = InProcess(partitions=3, clock=lambda: now[0])
    pipe.fold.retention_ns = RETENTION_NS
    return pipe


def test_an_ended_jobs_state_is_gone_after_the_retention_and_a_live_jobs_is_kept():
    now = [1_000_000_000_000]
    pipe = _pipe(now)
    for v in _job("old"):
        pipe.feed(v)
    assert len([s for s in pipe.summaries if s["job"] == "old"]) == 4
    before = _keys_of(pipe, "old")
    assert set(before) >= {"jobs", "members", "closed"} and _memory_of(pipe, "old")

    now[0] += RETENTION_NS // 2
    for v in _job("live", steps=2):
        pipe.feed(v)
    assert _sweep(pipe) == [], "nothing is dropped before the retention"
    assert _keys_of(pipe, "old") == before

    now[0] += RETENTION_NS // 2 + 1  # "old": past the retention; "live": half of it
    dropped = _sweep(pipe)
    assert sorted(dropped) == [("old", p) for p in range(3)]
    assert _keys_of(pipe, "old") == {} and _memory_of(pipe, "old") == []
    live = _keys_of(pipe, "live")
    assert set(live) >= {"jobs", "members", "closed"} and "active_ns" in _memory_of(pipe, "live")

    # the deletes are tombstones: a worker restarted from the changelogs holds only the live job
    again = pipe.restarted()
    assert _keys_of(again, "old") == {} and _keys_of(again, "live") == live
    assert all(
        blob is None for name, t in pipe.tables.items() if name != "agents" for k, blob in t.log.items() if "old" in k
    )


def test_a_live_jobs_state_is_kept_and_its_steps_still_close_after_another_job_expired():
    now = [1_000_000_000_000]
    pipe = _pipe(now)
    msgs = _job("long", steps=6, hosts=4)
    half = len(msgs) // 2
    for v in _job("short"):
        pipe.feed(v)
    for v in msgs[:half]:
        pipe.feed(v)
    n_before = len([s for s in pipe.summaries if s["job"] == "long"])
    for _ in range(4):  # "long" keeps sending (every quarter retention), "short" is silent
        now[0] += RETENTION_NS // 4 + 1
        pipe.feed(msgs[half])
        half += 1
        _sweep(pipe)
    assert _keys_of(pipe, "short") == {}
    assert _keys_of(pipe, "long")
    for v in msgs[half:]:
        pipe.feed(v)
    long_ = [s for s in pipe.summaries if s["job"] == "long"]
    assert len(long_) == 6 > n_before
    assert all(s["missing_hosts"] == [] and len(s["expected_hosts"]) == 4 for s in long_)


def test_a_job_with_an_open_step_is_not_dropped():
    now = [1_000_000_000_000]
    pipe = _pipe(now)
    msgs = _job("hung", steps=3)
    for v in msgs[: len(msgs) - 1]:  # the last host's last batch never comes: its step stays open
        pipe.feed(v)
    assert pipe.fold.steps, "an open step"
    now[0] += 2 * RETENTION_NS
    open_p = {st["p"] for _k, st in pipe.fold.open_steps()}
    dropped = _sweep(pipe)
    assert not open_p & {p for _j, p in dropped}
    for p in open_p:
        assert f"hung@{p}" in pipe.tables["jobs"]
    assert "last_seen" in _memory_of(pipe, "hung")


def test_a_drop_message_for_a_job_that_sent_data_since_changes_nothing():
    now = [1_000_000_000_000]
    pipe = _pipe(now)
    msgs = _job("back", steps=4)
    for v in msgs[:4]:
        pipe.feed(v)
    now[0] += 2 * RETENTION_NS
    expired = pipe.fold.expired_jobs()
    assert expired
    for v in msgs[4:]:  # data arrives between the sweep and the drop message
        pipe.feed(v)
    for job, p in expired:
        pipe._apply({"t": "drop", "job": job}, p)
    assert set(_keys_of(pipe, "back")) >= {"jobs", "members"}
    assert len([s for s in pipe.summaries if s["job"] == "back"]) == 4


def test_an_agent_instances_sequence_record_is_dropped_after_the_retention():
    now = [1_000_000_000_000]
    pipe = _pipe(now)
    for v in _job("a", hosts=2):
        pipe.feed(v)
    t0 = time.time_ns()
    for v in _job("b", hosts=2):
        pipe.feed(v)
    agents = pipe.tables["agents"]
    assert sorted(agents) == ["a/node0/a1", "a/node1/a1", "b/node0/a1", "b/node1/a1"]
    assert pipe.ingest.expired_agents(RETENTION_NS, None, t0) == []
    assert pipe.ingest.expired_agents(RETENTION_NS, {1}, t0 + 2 * RETENTION_NS) == [], "other input partitions"
    for aid in [a for a in pipe.ingest.expired_agents(RETENTION_NS, {0}, t0 + 2 * RETENTION_NS) if a[0] == "a"]:
        del agents[aid]
    assert sorted(agents) == ["b/node0/a1", "b/node1/a1"]
    assert sorted(agents.recovered()) == ["b/node0/a1", "b/node1/a1"], "tombstones: a restart holds only b"


_NO_CHILD = """
import sys
from obshub.streams.app import trim_heap  # (importing faust runs ``file -b python``: croniter's is_32bit)
spawned = []
sys.addaudithook(
    lambda event, args: spawned.append(event)
    if event.startswith(("subprocess.", "os.posix_spawn", "os.fork", "os.exec", "os.spawn", "os.system"))
    else None
)
print(trim_heap(), trim_heap(), spawned)
"""


def test_the_heap_trim_finds_the_c_library_without_starting_a_process():
    # the worker blocks SIGTERM/SIGINT before its first sweep (obshub/core/stopping.py), and a child inherits
    # the mask: ctypes.util.find_library("c") ran ``ldconfig -p`` (and gcc when that failed) at the first trim
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, "-c", _NO_CHILD], capture_output=True, text=True, cwd=root, timeout=60, check=True
    )
    assert done.stdout.split("\n")[0] == "True True []", done.stdout + done.stderr
