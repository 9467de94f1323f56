"""``obshub demo --ranks-per-host`` / ``--fault-rank``: bad combinations are refused before any cluster is
built (no root, no namespace), naming the option and what to use instead."""

from __future__ import annotations

import re

import pytest

from obshub.demo.errors import DemoError
from obshub.demo.runner import DemoOptions


@pytest.mark.parametrize(
    "kw, why",
    [
        ({"ranks_per_host": 0}, "--ranks-per-host 0"),
        ({"ranks_per_host": 2, "fault": "cpu", "fault_rank": 2}, "--fault-rank 2 is outside 0..1"),
        # `--fault cpu --fault-rank 1` alone read "outside 0..0": the option that gives a host more ranks is named
        ({"fault": "cpu", "fault_rank": 1}, r"outside 0\.\.0; .*unless --ranks-per-host 2\.\.8 says more"),
        ({"ranks_per_host": 2, "fault": "net-loss", "fault_rank": 1}, "only a cpu or hang fault hits one rank"),
        ({"ranks_per_host": 2, "fault": "mem", "fault_rank": 0}, "only a cpu or hang fault hits one rank"),
        ({"ranks_per_host": 2, "sequence": [("stall:cpu", 1), ("stall:net", 1)], "fault_rank": 1}, "stall:net"),
        ({"ranks_per_host": 2, "fault": "stall", "fault_params": {"layer": "net"}, "fault_rank": 1}, "one rank"),
    ],
)
def test_fault_rank_options_are_checked_before_the_cluster_is_built(kw, why):
    with pytest.raises(DemoError) as exc:
        DemoOptions(hosts=2, **kw).check()
    assert re.search(why, f"{exc.value}; {exc.value.hint}"), (str(exc.value), exc.value.hint)


def test_a_rank_fault_on_a_host_of_several_ranks_is_accepted():
    DemoOptions(hosts=2, ranks_per_host=2, fault="hang", fault_host=1, fault_rank=1).check()
    DemoOptions(hosts=2, ranks_per_host=4, fault="cpu", fault_host=0, fault_rank=3).check()
    # a stall of one rank's CPU or process (bench.ttd --stall cpu,process --ranks-per-host 2 --fault-rank 1)
    seq = [("stall:cpu", 1), ("stall:process", 1)]
    DemoOptions(hosts=2, ranks_per_host=2, sequence=seq, fault_host=1, fault_rank=1).check()
    DemoOptions(hosts=2, ranks_per_host=2, fault="stall", fault_params={"layer": "process"}, fault_rank=0).check()
