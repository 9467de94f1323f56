"""The per-step aggregates of the kernel (SCHED_STEP_SUM, MEM_STEP_SUM, CUDA_STEP_SUM) from raw record to
layer time: the reader decodes the record fields and histograms, the step accumulator folds them into the
layer's time, count and maximum exactly as the single records they replace would have been. No BPF."""

from __future__ import annotations

import struct

import pytest

from obshub.core import schema
from obshub.core.schema import Event, Kind
from obshub.producer.reader import EVENT_STRUCT, Decoder, hist_text, parse_hist
from obshub.streams import accumulate


def _raw(kind, dur=0, value=0, a0=0, a1=0, a2=0, s0=b"", s1=b"", step=3) -> bytes:
    return EVENT_STRUCT.pack(1_000, dur, 9, step, value, a0, a1, a2, 40, 41, int(kind), 0, 0, s0, s1)


def _hist(*counts) -> bytes:
    return struct.pack("<16I", *(list(counts) + [0] * (16 - len(counts))))


def test_histogram_text_round_trip():
    assert hist_text(_hist()) == "" and parse_hist("") == [0] * 16
    assert hist_text(_hist(0, 2, 0, 7)) == "0,2,0,7"
    assert parse_hist("0,2,0,7")[:5] == [0, 2, 0, 7, 0]
    for bad in ("1,-2", ",".join(["1"] * 17), "x"):
        with pytest.raises(ValueError):
            parse_hist(bad)


def test_aggregate_records_decode_to_schema_valid_events():
    d = Decoder({}, {})
    mem = d.decode(
        _raw(
            Kind.MEM_STEP_SUM,
            dur=5_000,
            value=12,
            a0=12 * 8 + 512,
            a1=2,
            a2=3_000,
            s0=_hist(0, 0, 0, 11, 0, 0, 0, 0, 0, 1),
        )
    )
    assert mem.payload == {"pages": 608, "stalls": 2, "stall_max_ns": 3_000, "orders": "0,0,0,11,0,0,0,0,0,1"}
    cuda = d.decode(_raw(Kind.CUDA_STEP_SUM, dur=90_000, value=30, a0=9_000, s0=_hist(0, 10, 20)))
    assert cuda.payload == {"max_ns": 9_000, "hist_us": "0,10,20"}
    sched = d.decode(
        _raw(
            Kind.SCHED_STEP_SUM,
            dur=7_000_000,
            value=2_000_000,
            a0=40,
            a1=38,
            a2=900_000,
            s0=_hist(5, 0, 3),
            s1=struct.pack("<Q", 4_000_000),
        )
    )
    assert sched.payload == {
        "switches": 40,
        "wakeups": 38,
        "runq_max_ns": 900_000,
        "offcpu_max_ns": 4_000_000,
        "runq_hist_us": "5,0,3",
    }
    for e in (mem, cuda, sched):
        schema.validate_event(list(e))
        assert e.step == 3 and e.trace_key == 9 and e.pid == 40


def test_aggregates_fold_into_layers_like_the_singles_they_replace():
    def layers(events):
        acc = accumulate.new_acc("h", 1)
        for e in events:
            accumulate.add_event(acc, e, 0)
        return acc["layers"]

    # 12 page allocations and 2 short reclaim stalls as singles ...
    singles = [Event(Kind.PAGE_ALLOC, 1, 0, 0, 3, 40, 41, -1, 3, {"gfp": 0})] * 12 + [
        Event(Kind.MEM_RECLAIM, 2, 2_000, 0, 3, 40, 41, -1, 1, {"reclaim": "direct"}),
        Event(Kind.MEM_RECLAIM, 3, 3_000, 0, 3, 40, 41, -1, 1, {"reclaim": "direct"}),
    ]
    # ... and as the kernel's aggregate of the step
    agg = Event(
        Kind.MEM_STEP_SUM,
        4,
        5_000,
        0,
        3,
        40,
        41,
        -1,
        12,
        {"pages": 96, "stalls": 2, "stall_max_ns": 3_000, "orders": "0,0,0,12"},
    )
    assert layers(singles)["memory"] == layers([agg])["memory"] == [5_000, 14, 3_000]
    launches = [
        Event(Kind.CUDA_LAUNCH, i, 1_000 + i, 0, 3, 40, 41, -1, 8, {"symbol": "cudaLaunchKernel", "rc": 0})
        for i in range(30)
    ]
    cagg = Event(
        Kind.CUDA_STEP_SUM,
        40,
        sum(1_000 + i for i in range(30)),
        0,
        3,
        40,
        41,
        -1,
        30,
        {"max_ns": 1_029, "hist_us": "0,30"},
    )
    assert layers(launches)["cuda"] == layers([cagg])["cuda"] == [sum(1_000 + i for i in range(30)), 30, 1_029]
