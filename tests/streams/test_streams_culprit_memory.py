"""The culprit of a step whose late rank waited at its memory cgroup's limit (culprit._memory_limited): the
kernel's reclaim retries are recorded, the wait after them is not, so lateness carries the stall."""

from __future__ import annotations

from obshub.streams.analysis.culprit import MEMLIMIT_MIN_RECORDS, culprit

MS = 1_000_000
HOSTS = ("node-00", "node-01", "node-02", "node-03")


def _summary(mem_counts: dict[str, int], ev: dict[str, dict[str, float]] | None = None, blame=None) -> dict:
    """A closed 4-host step of 830 ms over a 120 ms median, node-01 late by 700 ms (the straggler), with
    ``mem_counts`` memory records per host (hosts left out have no memory row)."""
    layers = {}
    for h in HOSTS:
        row = {"sched": {"count": 6, "max_ns": 20 * MS, "time_ns": 25 * MS}}
        if mem_counts.get(h):
            row["memory"] = {"count": mem_counts[h], "max_ns": 90_000, "time_ns": 500_000}
        layers[h] = row
    return {
        "baseline": {"n": 50, "median_ns": 120 * MS},
        "step_time_max_ns": 830 * MS,
        "evidence": {"hosts": ev if ev is not None else {"node-01": {"pytorch": 7.0}}, "spread_ns": 25 * MS},
        "straggler": {
            "host": "node-01",
            "excess_ns": 700 * MS,
            "group": [{"host": "node-01", "late_ns": 700 * MS}],
            "reason": "last at 3/3 collectives",
        },
        "blame": blame or [],
        "layers": layers,
        "stopped": {},
    }


def test_a_late_rank_at_its_memory_limit_is_a_memory_culprit():
    c = culprit(_summary({"node-01": 20}))
    assert (c["host"], c["layer"], c["source"], c["evidence"]) == ("node-01", "memory", "evidence", 7.0)
    assert "20 memory records" in c["why"]


def test_fewer_records_than_the_kernels_reclaim_retries_leave_the_lateness_to_the_process():
    c = culprit(_summary({"node-01": MEMLIMIT_MIN_RECORDS - 1}))
    assert (c["host"], c["layer"]) == ("node-01", "process")


def test_a_peer_with_about_as_many_records_makes_it_no_memory_culprit():
    c = culprit(_summary({"node-01": 20, "node-02": 12}))
    assert (c["host"], c["layer"]) == ("node-01", "process")
    c = culprit(_summary({"node-01": 20, "node-02": 10}))  # half of it: still its own
    assert c["layer"] == "memory"


def test_its_lossy_looking_connections_give_way_to_the_memory_limit():
    # a rank waiting at its limit does not read its sockets: its peers retransmit toward it
    c = culprit(_summary({"node-01": 27}, ev={"node-01": {"network": 2.0, "pytorch": 7.0}}))
    assert (c["host"], c["layer"], c["evidence"]) == ("node-01", "memory", 7.0)
    # its lateness below the evidence floor, its link's evidence the best: the link gives way too
    c = culprit(_summary({"node-01": 27}, ev={"node-01": {"network": 3.0, "pytorch": 1.0}}))
    assert (c["host"], c["layer"], c["evidence"]) == ("node-01", "memory", 3.0)
    assert "looked lossy" in c["why"]
    # a neighbour's retransmits (3 spreads) do not hide the late rank at its limit (node-01 campaign,
    # 2026-12-05: node-02 / network was named for an 800 ms memory stall of node-01)
    c = culprit(_summary({"node-01": 18}, ev={"node-01": {"pytorch": 7.0}, "node-02": {"network": 3.0}}))
    assert (c["host"], c["layer"]) == ("node-01", "memory")
    # without the memory records the lateness is a lossy link's victim's: the link is named
    c = culprit(_summary({}, ev={"node-01": {"pytorch": 7.0}, "node-02": {"network": 3.0}}))
    assert (c["host"], c["layer"]) == ("node-02", "network")
    # a link named on another host than the late one, which has no lateness evidence, keeps its culprit
    c = culprit(_summary({"node-01": 27}, ev={"node-02": {"network": 3.0}}))
    assert (c["host"], c["layer"]) == ("node-02", "network")


def test_a_straggler_named_by_blame_alone_at_its_memory_limit():
    blame = [{"host": "node-01", "layer": "pytorch", "excess_ns": 690 * MS}]
    c = culprit(_summary({"node-01": 18}, ev={}, blame=blame))
    assert (c["host"], c["layer"], c["source"]) == ("node-01", "memory", "blame")
    assert c["why"].startswith("straggler: last at 3/3 collectives; late with 18 memory records")
    assert culprit(_summary({}, ev={}, blame=blame))["layer"] == "process"
