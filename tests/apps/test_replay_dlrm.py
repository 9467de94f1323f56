"""Replay of the real 8-rank DLRM step (param-dlrm-8rank) checked against numbers computed
independently from the raw files with json and gzip only (method: tests/apps/test_replay_common.py).
The CLI -> Kafka -> stream worker path is in tests/apps/test_replay_streams.py."""

from __future__ import annotations

import pytest

from obshub.core import schema
from tests.apps.test_replay_common import dlrm_replay, raw_dlrm

pytestmark = pytest.mark.slow  # replays a real multi-rank DLRM trace set (seconds of parsing)


@pytest.fixture(scope="module")
def independent() -> dict:
    return raw_dlrm()


@pytest.fixture(scope="module")
def replayed():
    """(inputs, batches, report) of a replay of the DLRM folder into a list."""
    return dlrm_replay()


def test_all_ranks_found_with_their_execution_traces(replayed):
    inputs, _, _ = replayed
    assert [r.rank for r in inputs.ranks] == list(range(8))
    assert inputs.coverage() == "8 of 8 ranks present"
    for r in inputs.ranks:
        assert r.et is not None and r.et.path.name == f"dlrm_eg_{r.rank}.json.gz"
        assert r.stats.seq_source == "et"


def test_report_matches_independent_numbers(replayed, independent):
    _, _, rep = replayed
    (diag,) = rep.steps()
    assert diag.step == independent[0]["step"] == 10
    for r in diag.ranks:
        ind = independent[int(r.host.removeprefix("rank"))]
        assert r.start_ns == ind["start_us"] * 1000
        assert r.duration_ns == ind["dur_us"] * 1000
        assert r.first_coll_arrival_ns == ind["arrival_us"] * 1000
        assert r.wait_ns == ind["wait_us"] * 1000
        assert r.first_coll_kernel_ns == ind["kernel_us"] * 1000
    assert diag.straggler == f"rank{independent['straggler']}" == "rank7"
    # the first collective is the all_to_all with the ET's process-group sequence number 147
    assert diag.first_collective == ("0", 147, "all_to_all")
    skew_us = max(v["arrival_us"] for k, v in independent.items() if k != "straggler") - min(
        v["arrival_us"] for k, v in independent.items() if k != "straggler"
    )
    assert diag.skew_ns == skew_us * 1000


def test_batches_are_valid_and_one_agent_per_rank(replayed):
    _, batches, _ = replayed
    by_host: dict[str, list[schema.Batch]] = {}
    for b in batches:
        back = schema.decode_batch(schema.encode_batch(b))  # validates every field
        assert back.host == b.host and back.host_id == int(b.host[4:])
        by_host.setdefault(b.host, []).append(back)
    assert sorted(by_host) == sorted(f"rank{i}" for i in range(8))
    for host, bs in by_host.items():
        assert [b.seq for b in bs] == list(range(len(bs)))
        assert len({b.agent_id for b in bs}) == 1
        evs = [e for b in bs for e in b.events]
        reg = [e for e in evs if e.kind == schema.Kind.REGISTER]
        assert len(reg) == 1 and reg[0].value == int(host[4:]) and reg[0].payload["world_size"] == 8
        # the step end is the host's last event: nothing of the step arrives after it
        assert evs[-1].kind == schema.Kind.STEP_END
        colls = [e for e in evs if e.kind == schema.Kind.COLLECTIVE_BEGIN]
        assert [c.payload["coll_seq"] for c in colls] == list(range(147, 155))
        assert [c.payload["op"] for c in colls] == ["all_to_all"] * 4 + [
            "all_reduce",
            "all_to_all",
            "all_reduce",
            "all_reduce",
        ]
        # bytes from the ET/Kineto shapes: the first all_to_all moves 6144 floats
        assert colls[0].value == 6144 * 4
