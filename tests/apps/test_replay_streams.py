"""The stream application diagnoses replayed traces as live data: a real ``obshub streams worker`` on
its own topics, fed by ``obshub replay``, checked against numbers computed here from the raw DLRM files
with json and gzip only (method: tests/apps/test_replay_common.py) and against the stream
application's offline reference on the same batches."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from obshub.core import schema
from obshub.streams import offline
from tests.apps.test_replay_common import DLRM, HTA2, dlrm_batches, raw_dlrm
from tests.conftest import REPO
from tests.support import testkit

ANALYSIS_FIELDS = (
    "job",
    "step",
    "hosts",
    "expected_hosts",
    "missing_hosts",
    "step_time_ns",
    "step_time_max_ns",
    "straggler",
    "blame",
    "collectives",
    "layers",
)


def _raw_dlrm() -> dict[int, dict]:
    """rank -> step duration (ns), first NCCL kernel start (ns), from the raw files."""
    return {
        r: {"dur_ns": v["dur_us"] * 1000, "arrival_ns": v["arrival_us"] * 1000}
        for r, v in raw_dlrm().items()
        if isinstance(r, int)
    }


def _check_dlrm_summary(s: dict, job: str, raw: dict[int, dict]) -> None:
    hosts = [f"rank{i}" for i in range(8)]
    assert s["job"] == job and s["step"] == 10
    assert s["hosts"] == hosts and s["expected_hosts"] == hosts and s["missing_hosts"] == []
    assert s["step_time_ns"] == {f"rank{r}": v["dur_ns"] for r, v in raw.items()}
    first = min(s["collectives"], key=lambda c: (c["pg"], c["coll_seq"]))
    arrivals = {r: v["arrival_ns"] for r, v in raw.items()}
    last = max(arrivals, key=arrivals.get)
    assert (first["pg"], first["coll_seq"], first["op"]) == ("0", 147, "all_to_all")
    assert first["last_host"] == f"rank{last}" == "rank7"
    assert first["skew_ns"] == max(arrivals.values()) - min(arrivals.values())
    # ranks 2, 6 and 7 arrive within 0.5 ms of each other, 7 ms after the first rank in a ~16 ms step: no
    # rank leads alone, so the step names its last arriver with the late group, without a baseline
    assert s["straggler"]["host"] == "rank7"
    assert [g["host"] for g in s["straggler"]["group"]] == ["rank7", "rank6", "rank2"]
    assert s["world_size"] == 8 and s["inconsistent"] == []


@pytest.mark.slow
def test_offline_reference_on_replayed_batches():
    sums = offline.summarize_batches(dlrm_batches("dlrm-off"))
    assert list(sums) == [("dlrm-off", 10)]
    _check_dlrm_summary(sums[("dlrm-off", 10)], "dlrm-off", _raw_dlrm())


@pytest.fixture(scope="module")
def worker(kafka, tmp_path_factory):
    tag = f"rp-{uuid.uuid4().hex[:8]}"
    topics = testkit.make_topics(kafka, tag, partitions=2)
    w = testkit.Worker(topics, f"{tag}-app", 301, tmp_path_factory.mktemp("replay-streams") / "w.log", window_s=3.0)
    try:
        w.wait_ready(timeout_s=90)
        yield topics
    finally:
        w.stop()


def _replay(topics, folder, job) -> dict:
    """``obshub replay --json`` into the worker's input topic (the broker from the ``kafka`` fixture's env)."""
    r = subprocess.run(
        [sys.executable, "-m", "obshub.cli", "replay", str(folder), "--job", job, "--topic", topics.events, "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _summaries(kafka, topics, job, steps: set[int]) -> dict[int, dict]:
    def done(msgs):
        return steps <= {s["step"] for s in testkit.summaries(msgs) if s["job"] == job and s["closed_by"] != "hang"}

    msgs = testkit.collect(kafka, topics.steps, until=done, timeout_s=90)
    return {s["step"]: s for s in testkit.summaries(msgs) if s["job"] == job and s["closed_by"] != "hang"}


@pytest.mark.kafka
def test_worker_diagnoses_replayed_dlrm_like_the_raw_files(kafka, worker):
    """`obshub replay` (CLI, real broker) -> real worker -> summary, all checked against the raw files."""
    job = f"dlrm-w-{uuid.uuid4().hex[:6]}"
    out = _replay(worker, DLRM, job)
    raw = raw_dlrm()
    # the CLI's own diagnosis
    assert out["coverage"] == "8 of 8 ranks present"
    (step,) = out["steps"]
    assert step["straggler"] == f"rank{raw['straggler']}" == "rank7"
    assert {x["host"]: x["wait_ns"] for x in step["ranks"]} == {f"rank{i}": raw[i]["wait_us"] * 1000 for i in range(8)}
    assert {x["host"]: x["start_ns"] for x in step["ranks"]} == {
        f"rank{i}": raw[i]["start_us"] * 1000 for i in range(8)
    }
    # what reached Kafka: every batch, keyed by its host, one agent per rank
    n = sum(out["published"]["batches"].values())
    msgs = testkit.collect(kafka, worker.events, until=lambda ms: len(ms) >= n, timeout_s=60)
    batches = [schema.decode_batch(m.value()) for m in msgs]
    assert len(batches) == n and all(m.key().decode() == b.host for m, b in zip(msgs, batches))
    assert {b.host for b in batches} == {f"rank{i}" for i in range(8)}
    assert sum(len(b.events) for b in batches) == sum(out["published"]["events"].values())
    # the worker's summary
    got = _summaries(kafka, worker, job, {10})
    assert set(got) == {10}
    s = got[10]
    assert s["closed_by"] == "complete"  # every registered rank reported its step end
    _check_dlrm_summary(s, job, _raw_dlrm())
    ref = offline.summarize_batches(dlrm_batches(job))[(job, 10)]
    assert {k: s[k] for k in ANALYSIS_FIELDS} == {k: ref[k] for k in ANALYSIS_FIELDS}


@pytest.mark.kafka
def test_worker_on_partial_rank_set(kafka, worker):
    job = f"hta-w-{uuid.uuid4().hex[:6]}"
    out = _replay(worker, HTA2, job)
    assert out["coverage"] == "2 of 128 ranks present (missing 2-127)"
    got = _summaries(kafka, worker, job, {551, 552})
    for step in (551, 552):
        s = got[step]
        assert s["hosts"] == ["rank0", "rank1"] and s["missing_hosts"] == []
        mine = {r["host"]: r["duration_ns"] for r in next(x for x in out["steps"] if x["step"] == step)["ranks"]}
        assert s["step_time_ns"] == mine
        assert 0.5e9 < s["step_time_max_ns"] < 0.7e9
        # 2 of 128 ranks: the world size is in the summary for rules to see
        assert s["world_size"] == 128
    # the sampled trace pairs collectives that cannot be one (a kernel ends before its peer's begins):
    # reported, and never used to blame a host
    assert got[551]["inconsistent"] and got[551]["straggler"] is None
    assert all("before" in x["why"] or "waited" in x["why"] for x in got[551]["inconsistent"])
