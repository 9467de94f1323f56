"""Shared, cached inputs of the replay/export tests (no tests here): the DLRM traces replayed once
in-process, and the numbers computed independently from the raw files with json and gzip only.

Independent method: per rank, the step is the ``ProfilerStep#N`` span; the first collective is the
earliest NCCL kernel on the GPU (``ncclKernel_*``); its start is the rank's arrival (all ranks share one
host clock); a rank waits there for the last arrival, so ``wait = max(arrival) - arrival`` and the
straggler is the rank that arrived last. Cross-check that needs no clock: the NCCL kernel lasts the wait
plus the transfer, so ``kernel_dur - min(kernel_dur)`` equals the wait within a few µs.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json

from obshub.core import schema
from obshub.replay.inputs import ReplayInputs, discover
from obshub.replay.publish import publish
from obshub.replay.report import ReplayReport
from tests.conftest import SHARED_DATA

TRACES = SHARED_DATA / "traces"
DLRM = TRACES / "param-dlrm-8rank"
HTA2 = TRACES / "hta-trace-filter-2rank"
HTA1 = TRACES / "hta-nccl-metadata-rank0"


@functools.lru_cache(maxsize=1)
def raw_dlrm() -> dict:
    """rank -> {step, start_us, dur_us, arrival_us, kernel_us, wait_us}; plus "straggler" (a rank)."""
    out: dict = {}
    for f in sorted((DLRM / "dlrm_kineto").glob("*.json.gz")):
        d = json.load(gzip.open(f))
        ev = d["traceEvents"]
        (step,) = [e for e in ev if e.get("name", "").startswith("ProfilerStep#")]
        k = min(
            (e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")), key=lambda e: e["ts"]
        )
        out[d["distributedInfo"]["rank"]] = {
            "step": int(step["name"].split("#")[1]),
            "start_us": step["ts"],
            "dur_us": step["dur"],
            "arrival_us": k["ts"],
            "kernel_us": k["dur"],
        }
    last = max(r["arrival_us"] for r in out.values())
    kmin = min(r["kernel_us"] for r in out.values())
    for r in out.values():
        r["wait_us"] = last - r["arrival_us"]
        assert abs((r["kernel_us"] - kmin) - r["wait_us"]) <= 5, "the data's own consistency check"
    out["straggler"] = max((r for r in out if isinstance(r, int)), key=lambda r: out[r]["arrival_us"])
    return out


@functools.lru_cache(maxsize=1)
def dlrm_replay() -> tuple[ReplayInputs, tuple[schema.Batch, ...], ReplayReport]:
    """The DLRM folder replayed once into memory as job "dlrm" (batches of at most 500 events)."""
    inputs = discover([DLRM])
    batches: list[schema.Batch] = []
    rep = ReplayReport()
    publish(inputs, "dlrm", batches.append, observe=rep.observe, max_events=500)
    return inputs, tuple(batches), rep


def dlrm_batches(job: str) -> list[schema.Batch]:
    """The cached DLRM batches relabelled as job ``job``."""
    return [dataclasses.replace(b, job=job) for b in dlrm_replay()[1]]
