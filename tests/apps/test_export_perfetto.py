"""``obshub trace export``: the Chrome-trace / Perfetto JSON is structurally valid for Perfetto's JSON
importer, has a process per host and tracks per layer, flows joining each collective across hosts, and
the straggler and blamed layer marked.

``validate_chrome_trace`` mirrors what Perfetto's JSON importer (src/trace_processor/importers/json/)
needs to import a file without errors: an object with a ``traceEvents`` array; numeric ``ts`` and
integer ``pid``/``tid`` on every event; ``X`` slices with a non-negative ``dur`` that nest within a track
(a partial overlap is an import error); ``i`` instants with a scope ``s`` in g/p/t and, for process and
thread scope, a non-zero pid / tid (json_trace_parser_impl.cc counts those as parser failures); metadata ``M``
events with a known name and ``args``; v1 flows where every id has exactly one ``s`` and one ``f``,
with matching ``cat``/``name``, ``f`` bound to its enclosing slice (``"bp": "e"``) and both ends inside a
slice of their track.
"""

from __future__ import annotations

import bisect
import json
import subprocess
import sys
from collections import defaultdict

import pytest

from obshub.core import schema
from obshub.export.perfetto import HostEvents, build_trace
from tests.apps.test_replay_common import dlrm_batches, raw_dlrm
from tests.conftest import REPO

META_NAMES = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def validate_chrome_trace(doc) -> list[str]:
    """Every problem Perfetto's JSON importer would report for ``doc`` (empty list = clean)."""
    errs: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents array"]
    slices: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    flows: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    named_threads, named_procs, used_threads = set(), set(), set()
    for i, e in enumerate(doc["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(e, dict):
            errs.append(f"{where}: not an object")
            continue
        for k in ("ph", "ts", "pid", "tid"):
            if k not in e:
                errs.append(f"{where}: missing {k}")
        ph, ts = e.get("ph"), e.get("ts")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0:
            errs.append(f"{where}: ts {ts!r} is not a non-negative number")
            continue
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            errs.append(f"{where}: pid/tid must be integers")
            continue
        track = (e["pid"], e["tid"])
        if ph == "X":
            if not isinstance(e.get("name"), str) or not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                errs.append(f"{where}: X needs a name and dur >= 0")
                continue
            slices[track].append((ts, ts + e["dur"]))
            used_threads.add(track)
        elif ph == "i":
            if e.get("s") not in ("g", "p", "t"):
                errs.append(f"{where}: instant scope {e.get('s')!r}")
            elif (e["s"] == "p" and e["pid"] == 0) or (e["s"] == "t" and e["tid"] == 0):
                errs.append(f"{where}: a process/thread instant on pid/tid 0 is dropped by the importer")
            used_threads.add(track)
        elif ph == "M":
            if e.get("name") not in META_NAMES or not isinstance(e.get("args"), dict):
                errs.append(f"{where}: bad metadata {e.get('name')!r}")
            elif e["name"] == "thread_name":
                named_threads.add(track)
            elif e["name"] == "process_name":
                named_procs.add(e["pid"])
        elif ph in ("s", "f"):
            if "id" not in e:
                errs.append(f"{where}: flow without id")
                continue
            if ph == "f" and e.get("bp") != "e":
                errs.append(f"{where}: flow end not bound to its enclosing slice (bp e)")
            flows[(e.get("cat"), e.get("name"), e["id"])][ph].append((track, ts))
        else:
            errs.append(f"{where}: unexpected phase {ph!r}")
    for track, ss in slices.items():  # nesting per track
        ss.sort(key=lambda x: (x[0], -x[1]))
        stack: list[float] = []
        for b, en in ss:
            while stack and stack[-1] <= b:
                stack.pop()
            if stack and en > stack[-1] + 1e-9:
                errs.append(f"track {track}: slice [{b}, {en}] overlaps its parent ending {stack[-1]}")
                break
            stack.append(en)
    for key, ends in flows.items():
        if len(ends["s"]) != 1 or len(ends["f"]) != 1:
            errs.append(f"flow {key}: {len(ends['s'])} starts, {len(ends['f'])} ends")
            continue
        for track, ts in (ends["s"][0], ends["f"][0]):
            ss = sorted(slices.get(track, []))
            j = bisect.bisect_right(ss, (ts, float("inf")))
            if not any(b <= ts <= en for b, en in ss[:j]):
                errs.append(f"flow {key}: end at {ts} on {track} is inside no slice")
    for track in used_threads - named_threads:
        errs.append(f"track {track} has no thread_name")
    for pid in {t[0] for t in used_threads} - named_procs:
        errs.append(f"process {pid} has no process_name")
    return errs


def _dlrm_hosts() -> list[HostEvents]:
    hosts: dict[str, HostEvents] = {}
    for b in dlrm_batches("dlrm"):
        hosts.setdefault(b.host, HostEvents(b.host, b.host_id)).events.extend(b.events)
    return [hosts[f"rank{i}"] for i in range(8)]


SUMMARY = {
    "v": 1,
    "job": "dlrm",
    "step": 10,
    "straggler": {"host": "rank7", "score": 0.5, "excess_ns": 7_624_000, "reason": "last at 1/8 collectives"},
    "blame": [
        {
            "host": "rank7",
            "layer": "cuda",
            "excess_ns": 3_000_000,
            "straggler_ns": 9_000_000,
            "peer_median_ns": 6_000_000,
            "count": 40,
            "max_ns": 500_000,
        }
    ],
}


def _check_dlrm_timeline(doc, job: str) -> None:
    assert validate_chrome_trace(doc) == []
    ev = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs.values()) == sorted(f"rank{i}" for i in range(8))
    threads = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    for pid in procs:
        names = {n for p, n in threads if p == pid}
        assert {"steps", "collectives"} <= names
        assert any(n.startswith("pytorch tid") for n in names) and any(n.startswith("gpu") for n in names)
    # flows: 8 collectives, each from the last arriver to the 7 others
    starts = [e for e in ev if e["ph"] == "s"]
    assert len(starts) == 8 * 7
    assert {e["name"] for e in starts} == {f"pg 0 seq {s}" for s in range(147, 155)}
    first = [e for e in starts if e["name"] == "pg 0 seq 147"]
    assert {procs[e["pid"]] for e in first} == {"rank7"}  # rank7 arrived last at the first collective
    waited = {
        procs[e["pid"]]: e["args"]["waited_for_last_ns"]
        for e in ev
        if e["ph"] == "X" and e["name"] == "all_to_all #147"
    }
    raw = raw_dlrm()
    assert waited == {f"rank{r}": raw[r]["wait_us"] * 1000 for r in range(8)}
    assert len({e["tid"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}) == len(threads)
    # straggler and blame marks
    (mark,) = [e for e in ev if e["ph"] == "i" and e["name"].startswith("straggler:")]
    assert mark["name"] == "straggler: rank7" and procs[mark["pid"]] == "rank7" and mark["s"] == "p"
    assert mark["args"]["blame"][0]["layer"] == "cuda"
    (blamed,) = [e for e in ev if e["ph"] == "i" and e["name"].startswith("blamed:")]
    assert blamed["name"] == "blamed: cuda +3.000 ms" and procs[blamed["pid"]] == "rank7"
    assert any(e["ph"] == "X" and e["name"] == "step 10 (straggler)" and procs[e["pid"]] == "rank7" for e in ev)
    assert doc["otherData"]["job"] == job and doc["otherData"]["straggler_steps"] == [10]


@pytest.mark.slow
def test_timeline_from_replayed_events_is_valid_and_marked():
    doc = json.loads(json.dumps(build_trace(_dlrm_hosts(), {10: SUMMARY}, job="dlrm", steps=(10, 10))))
    _check_dlrm_timeline(doc, "dlrm")


def test_validator_catches_what_perfetto_rejects():
    bad = {
        "traceEvents": [
            {"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
            {"ph": "X", "name": "b", "ts": 5, "dur": 10, "pid": 1, "tid": 1},  # partial overlap
            {"ph": "s", "id": 1, "cat": "c", "name": "n", "ts": 1, "pid": 1, "tid": 1},  # no matching f
            {"ph": "i", "name": "x", "ts": 1, "pid": 1, "tid": 2},  # no scope, unnamed thread
            {"ph": "i", "s": "t", "name": "y", "ts": 1, "pid": 1, "tid": 0},  # thread instant on tid 0
            {"ph": "X", "name": "c", "dur": 1, "pid": 1, "tid": 1},  # no ts
        ]
    }
    errs = validate_chrome_trace(bad)
    assert any("overlaps" in e for e in errs) and any("1 starts, 0 ends" in e for e in errs)
    assert any("instant scope" in e for e in errs) and any("missing ts" in e for e in errs)
    assert any("pid/tid 0" in e for e in errs)
    assert any("no thread_name" in e for e in errs) and any("no process_name" in e for e in errs)


def test_overlapping_slices_are_split_into_lanes():
    evs = [
        schema.Event(schema.Kind.PYTORCH_OP, 1_000, 10_000, 0, 1, 1, 5, -1, 0, {"op": "a"}),
        schema.Event(schema.Kind.PYTORCH_OP, 5_000, 10_000, 0, 1, 1, 5, -1, 0, {"op": "b"}),
        schema.Event(schema.Kind.PYTORCH_OP, 6_000, 1_000, 0, 1, 1, 5, -1, 0, {"op": "c"}),
    ]
    doc = build_trace([HostEvents("h", 0, evs)], {}, job="j")
    assert validate_chrome_trace(doc) == []
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"pytorch tid 5", "pytorch tid 5 #2"}


@pytest.mark.parametrize("steps, ok", [("10", True), ("9-11", True), ("11-9", False), ("x", False)])
def test_steps_option(steps, ok):
    from click import BadParameter

    from obshub.export.cli import parse_steps

    if ok:
        a, b = parse_steps(steps)
        assert a <= 10 <= b
    else:
        with pytest.raises(BadParameter):
            parse_steps(steps)


def test_a_bad_steps_value_names_the_option():
    from click.testing import CliRunner

    from obshub.export.cli import trace_group

    res = CliRunner().invoke(trace_group, ["export", "--job", "j", "-o", "-", "--steps", "abc"])
    assert res.exit_code == 2 and "Invalid value for '--steps': 'abc' is not a step" in res.output, res.output
    args = ["export", "--job", "j", "-o", "-", "--steps", "1", "--since", "1h", "--until", "2h", "--bootstrap", "x:1"]
    res = CliRunner().invoke(trace_group, args)  # 2 hours ago is before 1 hour ago: refused before any read
    assert res.exit_code == 2 and "Invalid value for '--until': '2h' is before --since '1h'" in res.output, res.output


def test_an_output_folder_that_does_not_exist_is_refused_before_reading(tmp_path):
    from click.testing import CliRunner

    from obshub.core.errors import ObshubError
    from obshub.export.cli import trace_group

    out = tmp_path / "nope" / "t.json"
    res = CliRunner().invoke(
        trace_group, ["export", "--job", "j", "-o", str(out), "--steps", "1", "--bootstrap", "x:1"]
    )
    assert isinstance(res.exception, ObshubError) and "does not exist" in str(res.exception), res.output


@pytest.mark.kafka
def test_export_cli_from_kafka(kafka, unique, tmp_path):
    """Replayed batches on the broker, a step summary on the steps topic (as the stream worker writes
    it), then `obshub trace export`, on topics of its own."""
    from confluent_kafka import Producer

    from obshub.replay.publish import KafkaSink
    from tests.support import testkit

    job = f"dlrm-x-{unique}"
    topics = testkit.make_topics(kafka, f"ex-{unique}", partitions=2)  # isolated from other tests' traffic
    sink = KafkaSink(kafka.bootstrap_servers, topics.events)  # what `obshub replay` does (test_replay_streams)
    for b in dlrm_batches(job):
        sink(b)
    sink.close()
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    p.produce(topics.steps, key=job.encode(), value=json.dumps({**SUMMARY, "job": job}).encode())
    assert p.flush(30) == 0
    out = tmp_path / "t.json"
    topic_args = ["--events-topic", topics.events, "--steps-topic", topics.steps]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "obshub.cli",
            "trace",
            "export",
            "--job",
            job,
            "--steps",
            "9-11",
            "-o",
            str(out),
            *topic_args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "8 hosts" in r.stderr and "straggler marked in steps [10]" in r.stderr
    assert ", steps 10-10 (of 9-11 asked)," in r.stderr, "the steps found, not only the range asked"
    _check_dlrm_timeline(json.loads(out.read_text()), job)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "obshub.cli",
            "trace",
            "export",
            "--job",
            "no-such-job",
            "--steps",
            "1",
            "-o",
            str(out),
            *topic_args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 1 and "no events of job 'no-such-job'" in r.stderr
    from click.testing import CliRunner

    from obshub.export.cli import trace_group

    args = ["export", "--job", job, "--steps", "9-11", "-o", str(out), "--life", "3", *topic_args]
    res = CliRunner().invoke(trace_group, args, env={"OBSHUB_BOOTSTRAP": kafka.bootstrap_servers})
    assert res.exit_code == 1 and "no step summary of life 3 of job" in str(res.exception or res.output), res.output
    assert "(lives found: 0)" in str(res.exception or res.output)


def test_live_layers_get_their_own_tracks():
    K = schema.Kind
    evs = [
        schema.Event(K.STEP_BEGIN, 0, 0, 0, 3, 1, 1, -1, 3, {}),
        schema.Event(K.SCHED_OFFCPU, 1_000, 4_000, 0, 3, 1, 1, -1, 0, None),
        schema.Event(K.MEM_RECLAIM, 2_000, 3_000, 0, 3, 1, 1, -1, 12, None),
        schema.Event(K.TCP_RETRANSMIT, 3_000, 0, 0, 3, 1, 1, -1, 1, {"saddr": "10.0.0.1"}),
        schema.Event(
            K.NIC_COUNTER, 4_000, 1_000, 0, 3, 0, 0, -1, 9, {"dev": "mlx5_0", "port": 1, "counter": "out_of_sequence"}
        ),
        schema.Event(K.PCIE_AER, 5_000, 0, 0, 3, 0, 0, -1, 4096, {"dev": "0000:17:00.0"}),
        schema.Event(K.STEP_END, 9_000, 9_000, 0, 3, 1, 1, -1, 3, {}),
    ]
    doc = build_trace([HostEvents("node-a", 0, evs)], {}, job="live")
    assert validate_chrome_trace(doc) == []
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"steps", "sched", "memory", "network", "nic", "pcie"}
    assert doc["otherData"]["steps_without_summary"] == [3]


def test_a_host_of_several_ranks_gets_tracks_per_rank_and_the_straggler_rank_is_marked():
    """A new user's 2-rank host: the summary named rank 1 the straggler of step 9, blamed for pytorch, and
    the mark landed on rank 0's step slice (slices were kept per host). Each rank's tracks carry its
    global rank (pids from the summary's per-rank rows), the straggler's step slice and the blame mark
    are rank 1's, and a collective's flow starts at the rank that arrived last."""
    K = schema.Kind
    evs = []
    for pid, late in ((101, 0), (102, 40_000_000)):
        evs += [
            schema.Event(K.STEP_BEGIN, 0, 0, 0, 9, pid, pid, -1, 9, {}),
            schema.Event(K.PHASE, 60_000_000 + late, 60_000_000 + late, 0, 9, pid, pid, -1, 0, {"phase": "forward"}),
            schema.Event(
                K.COLLECTIVE_BEGIN,
                61_000_000 + late,
                0,
                0,
                9,
                pid,
                pid,
                -1,
                0,
                {"pg": "0", "coll_seq": 4, "op": "all_reduce"},
            ),
            schema.Event(
                K.COLLECTIVE_END,
                102_000_000,
                102_000_000 - 61_000_000 - late,
                0,
                9,
                pid,
                pid,
                -1,
                0,
                {"pg": "0", "coll_seq": 4, "op": "all_reduce"},
            ),
            schema.Event(K.STEP_END, 110_000_000, 110_000_000, 0, 9, pid, pid, -1, 9, {}),
        ]
    summary = {
        "step": 9,
        "straggler": {
            "host": "vm",
            "rank": 1,
            "local_rank": 1,
            "reason": "last at 1/1 collectives",
            "score": 0.7,
            "excess_ns": 40_000_000,
        },
        "blame": [{"host": "vm", "rank": 1, "layer": "pytorch", "excess_ns": 40_000_000}],
        "ranks": {"vm": {"0": {"pid": 101, "local_rank": 0}, "1": {"pid": 102, "local_rank": 1}}},
    }
    doc = build_trace([HostEvents("vm", 0, evs)], {9: summary}, job="two")
    assert validate_chrome_trace(doc) == []
    ev = doc["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"rank 0 steps", "rank 1 steps", "rank 0 collectives", "rank 1 collectives"} <= set(tracks.values())
    marked = [e for e in ev if e["ph"] == "X" and e["name"] == "step 9 (straggler)"]
    assert [tracks[e["tid"]] for e in marked] == ["rank 1 steps"]
    blamed = [e for e in ev if e["ph"] == "i" and e["name"].startswith("blamed: pytorch")]
    assert [tracks[e["tid"]].startswith("rank 1 pytorch") for e in blamed] == [True]
    assert [e["name"] for e in ev if e["name"].startswith("straggler:")] == ["straggler: vm rank 1"]
    colls = [e for e in ev if e["ph"] == "X" and e["name"].startswith("all_reduce")]
    assert {e["args"]["last_to_arrive"] for e in colls} == {"vm rank 1"}


def test_life_keeps_the_processes_of_that_life_only():
    """A job restarted on two hosts: steps 1-2 ran twice (pids 10/20, then 11/21 after the restart). The
    summaries of life 1 closed after the new processes started: ``keep_life`` keeps their events and the
    host events inside their span; life 0's closes keep the first processes'."""
    from obshub.export.source import generations, keep_life

    s = 1_000_000_000

    def ev(kind, step, pid, t):
        return schema.Event(kind, t, 0, step, 1, pid, pid, -1, 0, None)

    def hosts():
        out = {}
        for host, (p0, p1) in {"a": (10, 11), "b": (20, 21)}.items():
            evs = [ev(schema.Kind.STEP_BEGIN, st, p0, st * s) for st in (1, 2)]
            evs += [ev(schema.Kind.STEP_BEGIN, st, p1, 100 * s + st * s) for st in (1, 2)]
            evs += [ev(schema.Kind.PCIE_AER, 0, 0, 1 * s), ev(schema.Kind.PCIE_AER, 0, 0, 101 * s)]
            out[host] = HostEvents(host, 0, evs)
        return out

    gens = generations(hosts())
    assert [(g[0], g[1], g[2]) for g in gens] == [
        (1 * s, 2 * s, {("a", 10), ("b", 20)}),
        (101 * s, 102 * s, {("a", 11), ("b", 21)}),
    ]
    later = hosts()
    keep_life(later, [102 * s, 103 * s])  # life 1's steps closed after the restart
    assert {h: {(e.pid, e.ts_ns // s) for e in he.events} for h, he in later.items()} == {
        "a": {(11, 101), (11, 102), (0, 101)},
        "b": {(21, 101), (21, 102), (0, 101)},
    }
    first = hosts()
    keep_life(first, [3 * s, 4 * s, 101 * s])  # life 0: two closes before the restart, one 'restart' close after
    assert {e.pid for e in first["a"].events} == {10, 0} and {e.ts_ns // s for e in first["b"].events} == {1, 2}
    untouched = hosts()
    keep_life(untouched, [])
    assert len(untouched["a"].events) == 6
