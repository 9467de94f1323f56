"""A demo fault shaped with a qdisc the kernel lacks is refused at the argument check (exit 2, before any
namespace, broker or rank), and ``obshub doctor`` has a row per qdisc (walk24: ``--fault stall --param
layer=net --param delay_ms=150`` built the cluster, trained ~53 s, then exited 1 "no netem qdisc").
The kernel is asked for real: ``tc qdisc add`` in a throwaway network namespace (``unshare --net``)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from obshub.demo.errors import DemoError
from obshub.demo.runner import DemoOptions, needed_qdiscs

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("tc"), reason="needs root, unshare and tc"
)


def kernel_takes(words: list[str]) -> bool:
    """The test's own question to the kernel, asked apart from the code under test."""
    return (
        subprocess.run(
            ["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", *words], capture_output=True
        ).returncode
        == 0
    )


def test_the_qdiscs_each_fault_needs():
    assert needed_qdiscs(["net-slow"], {}) == [("tbf", "--fault net-slow (a tc tbf rate limit)")]
    assert [q for q, _ in needed_qdiscs(["stall"], {"layer": "net", "delay_ms": 150})] == ["netem"]
    assert [q for q, _ in needed_qdiscs(["stall:net", "cpu"], {"rate_kbit": 200})] == ["tbf"]
    assert needed_qdiscs(["stall"], {"layer": "net"}) == []  # a blackout: nftables, no qdisc
    assert needed_qdiscs(["stall"], {"layer": "cpu"}) == [] and needed_qdiscs(["net-loss", "cpu"], {}) == []


@needs_root
def test_an_rtt_spike_is_refused_at_the_check_when_the_kernel_has_no_netem():
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for opts in (
        DemoOptions(hosts=4, fault="stall", fault_host=0, fault_params={"layer": "net", "delay_ms": 150}),
        DemoOptions(fault="stall", sequence=[("stall:net", 1)], fault_params={"delay_ms": 150}, fault_for_s=30),
    ):
        if kernel_takes(["netem", "delay", "1ms"]):
            opts.check()
            continue
        with pytest.raises(DemoError, match=r"--param delay_ms .*no netem qdisc \(sch_netem; tc said: Error") as e:
            opts.check()
        assert "rate_kbit" in e.value.hint and "obshub doctor" in e.value.hint
    # the tbf shape, the way out, passes where the kernel has tbf
    if kernel_takes(["tbf", "rate", "1000kbit", "burst", "16kb", "latency", "100ms"]):
        DemoOptions(fault="stall", fault_params={"layer": "net", "rate_kbit": 200}).check()
        DemoOptions(fault="net-slow").check()
    # the check leaves no namespace behind (the throwaway one dies with its tc)
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == before


@needs_root
def test_doctor_has_a_row_per_qdisc_saying_what_is_lost():
    from obshub.doctor import qdisc_checks

    rows = {c.name: c for c in qdisc_checks()}
    assert set(rows) == {"qdisc netem", "qdisc tbf"}
    netem = rows["qdisc netem"]
    assert netem.ok is kernel_takes(["netem", "delay", "1ms"]) and netem.needed_by == ""
    if not netem.ok:
        assert "delay_ms" in netem.costs and "rate_kbit" in netem.fix and "Specified qdisc kind" in netem.found
    assert rows["qdisc tbf"].ok is kernel_takes(["tbf", "rate", "1000kbit", "burst", "16kb", "latency", "100ms"])
