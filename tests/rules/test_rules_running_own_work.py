"""A running record never names the network of a host late at its own work (docs/ANALYSIS.md "Inside a
running step"), on real running records of kept live runs (tests/rules/data/early23_running.json.gz: each
``{run, kind, summary}``, the record as the worker sent it, its collectives and layer statistics left out).

CPU bursts named their host's network while the step ran: frame22-accum-2 step 505 (node-01, 800 ms, the
accum workload) and burst21-quota-new-1 step 279 (node-03, 800 ms, shape=quota) fired a wrong
``step_stall`` each (right host, wrong layer; the close named sched 0.1 s later). The quota run's firing
record (x5.0, 3 spreads) is not among its kept steps; its kept record of the same step (x4.5, 2 spreads,
vetoed) has the same shape, as has frame21-lightning-cpuproc step 379 (node-02's burst, 2 ranks per host,
Lightning; named by its RTT, no alert). Each starved host was behind its peers at its own work (8 phases
against 10, 2 against 4, 2 a rank against 4) and named by a view a late host gives too (its peers'
retransmits toward it, its connections' RTT). The right running records beside them (blackouts named by
the same views or by the host's own drops) are as far as their busiest peer and stay named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from obshub.streams import analysis
from tests.rules.test_rules_burst import fire_at_close

RECORDS = json.loads(gzip.decompress((Path(__file__).parent / "data" / "early23_running.json.gz").read_bytes()))


def _stalls(firing: list[dict]) -> list[tuple]:
    return [(a["labels"]["host"], a["labels"]["layer"]) for a in firing if a["rule"] == "step_stall"]


@pytest.mark.parametrize("rec", [r for r in RECORDS if r["kind"] == "wrong"], ids=lambda r: r["run"])
def test_a_cpu_burst_s_running_record_names_no_network_of_the_starved_host(rec):
    s = rec["summary"]
    host = s["culprit"]["host"]
    if rec["run"] == "frame22-accum-2":
        # as kept (the worker of f174a23 sent it): step_stall names the burst host's network, a wrong layer
        assert _stalls(fire_at_close([s])) == [(host, "network")]
    counts = analysis.running_counts(s)
    mine = counts[host][0] / counts[host][1]
    assert any(c / k > mine for h, (c, k) in counts.items() if h != host)  # behind its peers at its own work
    # the worker sends no running record for it now (no other host had evidence): nothing fires
    assert analysis.running_rejudge(s) is None


@pytest.mark.parametrize(
    "rec", [r for r in RECORDS if r["kind"] == "right"], ids=lambda r: f"{r['run']}-{r['summary']['step']}"
)
def test_a_blackout_s_running_record_is_still_named_early(rec):
    s = rec["summary"]
    host = s["culprit"]["host"]
    assert analysis.running_rejudge(s) is s
    assert _stalls(fire_at_close([analysis.running_rejudge(s)])) == [(host, "network")]
