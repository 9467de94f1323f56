"""The HTA traces: a partial rank set of a 128-rank job (older format, epoch µs) and one rank of the
newer format (``baseTimeNanoseconds``, collective metadata on ``record_param_comms`` and kernels)."""

from __future__ import annotations

import functools
import gzip
import json

import pytest

from obshub.core import schema
from obshub.replay.inputs import discover
from obshub.replay.publish import publish
from obshub.replay.report import ReplayReport
from tests.conftest import SHARED_DATA

TRACES = SHARED_DATA / "traces"


def _replay(folder):
    inputs = discover([folder])
    batches: list[schema.Batch] = []
    rep = ReplayReport()
    publish(inputs, "hta", batches.append, observe=rep.observe)
    return inputs, [schema.decode_batch(schema.encode_batch(b)) for b in batches], rep


@functools.lru_cache(maxsize=4)
def _raw(path) -> dict:
    return json.load(gzip.open(path))


def _raw_steps(path) -> tuple[dict[int, tuple], int]:
    """step -> (ts µs, dur µs) of the ProfilerStep spans, and baseTimeNanoseconds (0 when absent)."""
    d = _raw(path)
    return {
        int(e["name"].split("#")[1]): (e["ts"], e["dur"])
        for e in d["traceEvents"]
        if e.get("name", "").startswith("ProfilerStep#")
    }, d.get("baseTimeNanoseconds", 0)


@pytest.mark.slow
def test_two_of_128_ranks_load_and_are_reported_incomplete():
    folder = TRACES / "hta-trace-filter-2rank"
    inputs, batches, rep = _replay(folder)
    assert inputs.world_size == 128
    assert inputs.coverage() == "2 of 128 ranks present (missing 2-127)"
    assert inputs.missing_ranks == list(range(2, 128))
    diags = rep.steps()
    assert [d.step for d in diags] == [551, 552]
    for rank in (0, 1):
        raw, base = _raw_steps(folder / f"sampled_rank-{rank}.json.gz")
        assert base == 0
        for d in diags:
            (r,) = [x for x in d.ranks if x.host == f"rank{rank}"]
            ts, dur = raw[d.step]
            assert r.start_ns == int(ts) * 1000 and r.duration_ns == int(dur * 1000)
            assert 0.5e9 < r.duration_ns < 0.7e9  # ~0.6 s steps of this recommendation model
    for d in diags:  # both ranks share every collective of a step; one of them arrived last
        assert d.first_collective is not None and d.straggler in ("rank0", "rank1")
    kinds = {schema.Kind(e.kind) for b in batches for e in b.events}
    assert {
        schema.Kind.PYTORCH_OP,
        schema.Kind.CUDA_LAUNCH,
        schema.Kind.CUDA_MEMCPY,
        schema.Kind.COLLECTIVE_BEGIN,
        schema.Kind.COLLECTIVE_END,
        schema.Kind.NCCL_COLL,
    } <= kinds
    # every mapped event of a step lies in the step's wall time on the CPU, or runs on the GPU after it began
    for b in batches:
        raw, _ = _raw_steps(folder / f"sampled_rank-{b.host_id}.json.gz")
        for e in b.events:
            if e.step >= 0 and e.gpu < 0 and e.kind not in (schema.Kind.STEP_END, schema.Kind.COLLECTIVE_END):
                ts, dur = raw[e.step]
                assert ts * 1000 <= e.ts_ns <= (ts + dur) * 1000


def test_printed_report_says_the_rank_set_is_incomplete():
    from io import StringIO

    from rich.console import Console

    from obshub.replay.cli import _print, summary_dict

    inputs, _, rep = _replay(TRACES / "hta-trace-filter-2rank")
    buf = StringIO()
    _print(Console(file=buf, width=200), summary_dict("hta", inputs, rep.steps(), None))
    text = buf.getvalue()
    assert "job hta: 2 of 128 ranks present (missing 2-127)" in text
    assert "step 551" in text and "step 552" in text and "straggler" in text


@pytest.mark.slow
def test_newer_format_base_time_and_collective_metadata():
    folder = TRACES / "hta-nccl-metadata-rank0"
    inputs, batches, rep = _replay(folder)
    assert inputs.coverage() == "1 of 2 ranks present (missing 1)"
    raw, base = _raw_steps(folder / "nccl_data.json.gz")
    assert base == 1711964646000000000
    diags = rep.steps()
    assert [d.step for d in diags] == sorted(raw) == [4, 5, 6]
    for d in diags:
        (r,) = d.ranks
        ts, dur = raw[d.step]
        assert r.start_ns == base + round(ts * 1000)
        assert abs(r.duration_ns - dur * 1000) <= 1
        assert d.straggler is None  # one rank alone: nobody to wait for
    # 2024-05-23 00:15 UTC, as the Kineto log lines in the file say (17:15 PDT on 2024-05-22)
    assert 1716422400e9 < diags[0].ranks[0].start_ns < 1716508800e9
    colls = [e for b in batches for e in b.events if e.kind == schema.Kind.COLLECTIVE_END]
    d = _raw(folder / "nccl_data.json.gz")
    rpc = sorted(
        (
            e
            for e in d["traceEvents"]
            if e.get("name") == "record_param_comms" and e["args"].get("Collective name") not in (None, "wait")
        ),
        key=lambda e: e["ts"],
    )
    assert len(colls) == len(rpc) == 21
    for c, e in zip(sorted(colls, key=lambda c: c.ts_ns), rpc):
        size = {"Float": 4, "Long": 8, "Int": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Byte": 1}[e["args"]["dtype"]]
        assert c.value == e["args"]["In msg nelems"] * size
        assert c.payload["op"] == {"allreduce": "all_reduce", "broadcast": "broadcast"}[e["args"]["Collective name"]]
        assert c.payload["pg"] == e["args"]["Process Group Name"] == "0"
        assert c.payload["timing"] == "gpu"
    assert [c.payload["coll_seq"] for c in sorted(colls, key=lambda c: c.ts_ns)] == list(range(21))
