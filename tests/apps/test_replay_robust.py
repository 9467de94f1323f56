"""Robustness of the replay: truncated and invalid files give clear errors; unknown categories and
missing fields are skipped and counted; memory stays bounded on a large file (streamed, not loaded)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter

import pytest

from obshub.core import schema
from obshub.replay.errors import ReplayError, TraceFormatError
from obshub.replay.inputs import discover
from obshub.replay.mapping import map_rank
from tests.conftest import REPO, SHARED_DATA

DLRM0 = next((SHARED_DATA / "traces" / "param-dlrm-8rank" / "dlrm_kineto").glob("worker0_*.json.gz"))


def _map_all(path):
    inputs = discover([path])
    (rt,) = inputs.ranks
    return rt, list(map_rank(rt, "t"))


def test_truncated_json_is_a_clear_error(tmp_path):
    raw = gzip.decompress(DLRM0.read_bytes())
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(gzip.compress(raw[: len(raw) * 6 // 10]))
    with pytest.raises(TraceFormatError) as ei:
        discover([p])
    msg = str(ei.value)
    assert str(p) in msg and "ends early" in msg and "events" in msg
    assert "truncated" in ei.value.hint


def test_truncated_gzip_stream_is_a_clear_error(tmp_path):
    data = DLRM0.read_bytes()
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="gzip stream broken"):
        discover([p])


def test_a_json_gz_that_is_not_gzip_says_so(tmp_path):
    p = tmp_path / "rank0.json.gz"
    p.write_text('{"traceEvents": [{"ph": "X",, }]}')  # renamed plain text, and not JSON either
    with pytest.raises(TraceFormatError, match="named .gz but not gzip-compressed") as ei:
        discover([p])
    assert "gzip-compressed" in ei.value.hint
    plain = tmp_path / "rank0.json"
    plain.write_text('{"traceEvents": [{"ph": "X",, }]}')
    with pytest.raises(TraceFormatError) as ei:
        discover([plain])
    assert "gzip" not in str(ei.value)


@pytest.mark.parametrize(
    "text, expect",
    [
        ('{"traceEvents": [{"ph": "X",, }]}', "not valid JSON"),
        ('{"foo": 1}', "contains no trace events"),
        ("[1, 2, 3]", "contains no trace events .3 element.s., none of them a JSON object"),
        ('{"traceEvents": ["a", "b"]}', "contains no trace events"),
        ('{"schema": "1.0.1", "pid": 7, "nodes": []}', "no Kineto trace"),
    ],
)
def test_invalid_files(tmp_path, text, expect):
    p = tmp_path / "x.json"
    p.write_text(text)
    with pytest.raises((TraceFormatError, ReplayError), match=expect):
        discover([p])


def test_cli_error_is_operator_readable(tmp_path):
    p = tmp_path / "rank3.json"
    p.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    r = subprocess.run(
        [sys.executable, "-m", "obshub.cli", "replay", str(p), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 1
    assert "error:" in r.stderr and "hint:" in r.stderr and "rank3.json" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_categories_and_missing_fields_are_skipped_and_counted(tmp_path):
    evs = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 100, "dur": 900},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 200, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "dur": 10},  # no ts
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": "soon", "dur": 1},
        "garbage",
        {"ph": "X", "cat": "weird_cat", "name": "x", "pid": 1, "tid": 1, "ts": 300, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 300, "dur": 1},  # no name
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGetDevice", "pid": 1, "tid": 1, "ts": 310, "dur": 1},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 320,
            "dur": 3,
            "args": {"correlation": 5},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm",
            "pid": 0,
            "tid": 7,
            "ts": 330,
            "dur": 20,
            "args": {"device": 0, "stream": 7, "correlation": 5, "grid": [2, 3, 1]},
        },
        {"ph": "B", "cat": "cpu_op", "name": "open", "pid": 1, "tid": 1, "ts": 400},
    ]
    p = tmp_path / "messy.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": evs}))
    rt, out = _map_all(p)
    sk = rt.stats.skipped
    assert sk["missing or invalid ts"] == 2
    assert sk["not a JSON object"] == 1
    assert sk["unknown category 'weird_cat'"] == 1
    assert sk["missing name"] == 1
    assert sk["CUDA runtime call other than launch/sync/memcpy"] == 1
    assert sk["phase 'B' (only complete 'X' events are mapped)"] == 1
    kinds = Counter(schema.Kind(e.kind).name for e in out)
    assert kinds == {"REGISTER": 1, "STEP_BEGIN": 1, "STEP_END": 1, "PYTORCH_OP": 1, "CUDA_LAUNCH": 2}
    gpu = [e for e in out if e.kind == schema.Kind.CUDA_LAUNCH and e.gpu == 0]
    assert len(gpu) == 1 and gpu[0].value == 6 and gpu[0].step == 3 and gpu[0].duration_ns == 20_000
    for e in out:
        schema.validate_event(list(e))


def test_a_list_where_a_category_or_correlation_id_belongs_is_skipped(tmp_path):
    """Values JSON allows but a trace never holds (a list as ``cat`` or ``args.correlation``) are
    skipped and counted like any invalid field, never a crash."""
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 100, "dur": 900}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 320, "dur": 3}
    kernel = {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0, "tid": 7}
    evs = [
        step,
        {**launch, "args": {"correlation": [1]}},
        {**kernel, "ts": 330, "dur": 20, "args": {"device": 0, "stream": 7, "correlation": [1]}},
        {"ph": "X", "cat": [1], "name": "aten::mm", "pid": 1, "tid": 1, "ts": 200, "dur": 10},
    ]
    p = tmp_path / "lists.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": evs}))
    rt, out = _map_all(p)
    assert rt.stats.skipped["invalid cat (not a string)"] == 1
    assert [schema.Kind(e.kind).name for e in out].count("CUDA_LAUNCH") == 1
    for e in out:
        schema.validate_event(list(e))


def test_trace_without_steps_is_flagged(tmp_path):
    p = tmp_path / "rank0.json"
    p.write_text(
        json.dumps(
            {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "dur": 2}]}
        )
    )
    rt, out = _map_all(p)
    assert rt.rank == 0  # from the file name, there being no distributedInfo
    assert any("no ProfilerStep" in n for n in rt.stats.notes)
    assert [e.step for e in out if e.kind == schema.Kind.PYTORCH_OP] == [-1]


BIG_SCRIPT = r"""
import json, resource, sys
from pathlib import Path
from obshub.replay.inputs import discover
from obshub.replay.publish import publish
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = [0]
inputs = discover([Path(sys.argv[1])])
publish(inputs, "big", lambda b: n.__setitem__(0, n[0] + len(b.events)))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_kb": base, "peak_kb": peak, "events": n[0]}))
"""


def _write_big(path, n_steps: int, per_step: int) -> int:
    """A plain JSON Kineto-like file with ``n_steps * per_step * 2`` op/kernel events; returns the count."""
    n = 0
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [\n')
        ts = 1_000_000
        for s in range(n_steps):
            f.write(
                json.dumps(
                    {
                        "ph": "X",
                        "cat": "user_annotation",
                        "name": f"ProfilerStep#{s}",
                        "pid": 9,
                        "tid": 9,
                        "ts": ts,
                        "dur": per_step * 10,
                    }
                )
                + ",\n"
            )
            chunk = []
            for i in range(per_step):
                t = ts + i * 10
                chunk.append(
                    f'{{"ph": "X", "cat": "cpu_op", "name": "aten::op_{i % 97}_with_a_long_name_'
                    f'like_real_ones", "pid": 9, "tid": 9, "ts": {t}, "dur": 5, "args": '
                    f'{{"External id": {n + i}, "Input Dims": [[64, 128], [128]], "Input type": '
                    f'["float", "float"]}}}},\n'
                )
                chunk.append(
                    f'{{"ph": "X", "cat": "kernel", "name": "void gemm_kernel<{i % 13}>(float*)", '
                    f'"pid": 0, "tid": 7, "ts": {t + 3}, "dur": 4, "args": {{"device": 0, "stream": 7, '
                    f'"correlation": {n + i}, "grid": [4, 1, 1]}}}},\n'
                )
            f.write("".join(chunk))
            n += per_step * 2
            ts += per_step * 10 + 100
        f.write('{"ph": "M", "name": "process_name", "pid": 9, "tid": 0, "args": {"name": "python"}}\n')
        f.write('], "baseTimeNanoseconds": 0}\n')
    return n


@pytest.mark.slow
def test_memory_stays_bounded_on_a_large_file(tmp_path):
    p = tmp_path / "big_rank0.json"
    n = _write_big(p, n_steps=10, per_step=3_000)
    size = p.stat().st_size
    assert size > 12e6
    r = subprocess.run(
        [sys.executable, "-c", BIG_SCRIPT, str(p)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    # REGISTER + 10 STEP_BEGIN + 10 STEP_END + every op and kernel
    assert res["events"] == n + 21
    growth_bytes = (res["peak_kb"] - res["base_kb"]) * 1024
    # json.load of this file alone grows RSS by ~5x its size (~70 MB); streaming needs a small fixed amount
    assert growth_bytes < size / 2, f"peak RSS grew by {growth_bytes / 1e6:.1f} MB on a {size / 1e6:.1f} MB file"


@pytest.mark.slow
def test_recorded_speed_paces_the_replay():
    """--speed: the replay takes at least the recorded span divided by the speed (a lower bound only,
    which load on the machine cannot break)."""
    from obshub.replay.publish import publish

    inputs = discover([SHARED_DATA / "traces" / "param-dlrm-8rank" / "dlrm_kineto"])
    starts = [r.steps[0].begin_ns for r in inputs.ranks]
    ends = [r.steps[-1].end_ns for r in inputs.ranks]
    span_s = (max(ends) - min(starts)) / 1e9  # ~20 ms of recorded time
    res = publish(inputs, "paced", lambda _b: None, speed=0.05)  # 20x slower than recorded
    assert res.wall_s >= 0.9 * span_s / 0.05 - 0.05
    assert sum(res.events.values()) > 8 * 1000


def test_execution_trace_that_does_not_match_is_reported(tmp_path):
    """An ET listing other collectives than the Kineto trace is not trusted for sequence numbers."""
    kineto = next((SHARED_DATA / "traces" / "param-dlrm-8rank" / "dlrm_kineto").glob("worker0_*.json.gz"))
    et = tmp_path / "dlrm_eg_0.json"
    et.write_text(
        json.dumps(
            {
                "schema": "1.0.1",
                "pid": 59811,
                "nodes": [
                    {
                        "name": "record_param_comms",
                        "id": 5,
                        "rf_id": 5,
                        "inputs": [[1, 2, 0, 16, 4, "cuda:0"], 7, 1234, 0, "allreduce", [], []],
                    }
                ],
            }
        )
    )
    inputs = discover([kineto], [et])
    (rt,) = inputs.ranks
    assert rt.et is not None
    colls = [e for e in map_rank(rt, "t") if e.kind == schema.Kind.COLLECTIVE_BEGIN]
    assert rt.stats.seq_source == "order"
    assert [c.payload["coll_seq"] for c in colls] == list(range(8))
    assert any("do not match" in n for n in rt.stats.notes)


def _strategies():
    from hypothesis import strategies as st

    num = st.one_of(
        st.integers(-(10**18), 10**18),
        st.floats(allow_nan=False, allow_infinity=False),
        st.none(),
        st.text(max_size=3),
        st.booleans(),
    )
    cat = st.sampled_from(
        [
            "cpu_op",
            "user_annotation",
            "cuda_runtime",
            "cuda_driver",
            "kernel",
            "gpu_memcpy",
            "gpu_memset",
            "python_function",
            "ac2g",
            "weird",
            None,
            7,
            [1],  # not hashable
        ]
    )
    name = st.one_of(
        st.sampled_from(
            [
                "ProfilerStep#1",
                "ProfilerStep#99999999999999999999",
                "record_param_comms",
                "nccl:all_reduce",
                "ncclKernel_AllReduce_RING_LL_Sum_float",
                "ncclDevKernel_Broadcast_RING_LL",
                "cudaLaunchKernel",
                "cudaDeviceSynchronize",
                "cudaMemcpyAsync",
                "Optimizer.step#SGD.step",
                "## forward ##",
                "aten::mm",
            ]
        ),
        st.text(max_size=20),
        st.none(),
    )
    args = st.one_of(
        st.none(),
        st.text(max_size=3),
        st.fixed_dictionaries(
            {},
            optional={
                "correlation": st.one_of(num, st.lists(st.integers(0, 9), max_size=2)),
                "device": num,
                "stream": num,
                "bytes": num,
                "grid": st.lists(num, max_size=3),
                "Collective name": st.one_of(st.sampled_from(["allreduce", "wait", "broadcast"]), num),
                "In msg nelems": num,
                "dtype": st.sampled_from(["Float", "Long", "weird"]),
                "Seq": num,
                "Process Group Name": st.one_of(st.text(max_size=3), num),
                "Input Dims": st.one_of(st.lists(st.lists(num, max_size=2), max_size=2), num),
                "Input type": st.one_of(st.lists(st.sampled_from(["float", "int", "x"]), max_size=2), num),
            },
        ),
    )
    event = st.one_of(
        st.fixed_dictionaries(
            {
                "ph": st.sampled_from(["X", "X", "X", "i", "M", "s", None]),
                "cat": cat,
                "name": name,
                "ts": num,
                "dur": num,
                "pid": num,
                "tid": num,
                "args": args,
            }
        ),
        num,
        st.lists(num, max_size=2),
    )
    return st.lists(event, max_size=25)


def test_any_event_content_maps_to_valid_events_or_is_skipped(tmp_path_factory):
    """Property: whatever valid JSON the events hold, mapping never raises and everything emitted
    validates against the wire schema."""
    from hypothesis import HealthCheck, given, settings

    d = tmp_path_factory.mktemp("fuzz")

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_strategies())
    def check(evs):
        base = [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 10, "dur": 1000}
        ]
        p = d / "rank0.json"
        p.write_text(
            json.dumps(
                {"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": base + evs},
                default=str,
                allow_nan=False,
            )
        )
        rt, out = _map_all(p)
        for e in out:
            schema.validate_event(list(e))
        batch = schema.Batch("fuzz", "rank0", 0, "a", 0, out)
        assert schema.decode_batch(schema.encode_batch(batch)).events == out

    check()


def test_unreachable_broker_fails_fast_with_a_hint():
    from obshub.replay.publish import KafkaSink

    with pytest.raises(ReplayError, match="cannot reach the Kafka broker at 127.0.0.1:1") as ei:
        KafkaSink("127.0.0.1:1", connect_timeout_s=2)
    assert "obshub up" in ei.value.hint


def test_other_json_in_a_trace_folder_is_skipped_but_a_broken_trace_is_not(tmp_path):
    (tmp_path / "rank0.json.gz").write_bytes(DLRM0.read_bytes())
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    inputs = discover([tmp_path])
    assert [r.rank for r in inputs.ranks] == [0]
    assert any("skipped 1 JSON file" in n and "config.json" in n for n in inputs.notes)
    (tmp_path / "rank1.json").write_text('{"traceEvents": [{"ph": "X"')
    with pytest.raises(TraceFormatError, match="rank1.json"):
        discover([tmp_path])
