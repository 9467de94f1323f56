"""``python -m bench.net_queue_cost`` end to end at a small size (real namespaces, a real tbf, the agent's own
BPF program): the probe runs where a qdisc holds segments and its cost is read from the kernel's statistics;
a bad ``--qdiscs`` is refused before anything is set up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.probes_util import need_bpf

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OBSHUB_BENCH_RESULTS": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "bench.net_queue_cost", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.bpf
def test_the_probe_runs_through_a_tbf_and_its_cost_is_measured(tmp_path):
    need_bpf()
    r = _run(tmp_path, "--rounds", "1", "--mb", "2", "--tbf-mb", "2", "--qdiscs", "tbf")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((tmp_path / "net_queue_cost.json").read_text())["rows"]
    tbf = rows["tbf"]
    assert len(tbf["on_cpu"]) == 2 and len(tbf["off_cpu"]) == 2  # off, on, on, off
    assert min(tbf["runs"]) > 0, tbf  # a tbf dequeues: the probe ran
    assert all(0 < ns < 1_000_000 for ns in tbf["ns"]), tbf  # ns per run from the kernel's statistics
    assert min(tbf["pkts"]) > 100, tbf  # ~700 packets a MiB went through the qdisc
    assert not subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count("obnq-")


def test_an_unknown_qdisc_is_refused_with_the_known_ones(tmp_path):
    r = _run(tmp_path, "--qdiscs", "tbf,netem")
    assert r.returncode == 2
    assert "--qdiscs: unknown netem (known: pfifo_fast, fq_codel, tbf)" in r.stderr
    assert not (tmp_path / "net_queue_cost.json").exists()


def _kernel_lacks_fq_codel() -> bool:
    """Whether this kernel was built without sch_fq_codel (neither built in nor a module), from its config."""
    import gzip

    try:
        config = gzip.decompress(Path("/proc/config.gz").read_bytes()).decode()
    except OSError:
        return False
    return "# CONFIG_NET_SCH_FQ_CODEL is not set" in config


@pytest.mark.slow
def test_every_qdisc_skipped_exits_1_naming_why_before_the_bpf_compilation(tmp_path):
    """A run whose every qdisc the kernel refuses measured nothing: it printed an empty table and exited 0
    after minutes of BPF compilation. Now it exits 1 before the compilation, with tc's reason per qdisc."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    if not _kernel_lacks_fq_codel():
        pytest.skip("this kernel has fq_codel (or no /proc/config.gz): no qdisc is refused here")
    r = _run(tmp_path, "--rounds", "1", "--mb", "1", "--qdiscs", "fq_codel")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "nothing measured: every qdisc given was skipped: fq_codel skipped (" in r.stderr, r.stderr
    assert "try --qdiscs pfifo_fast,tbf" in r.stderr, r.stderr
    assert "fq_codel: skipped:" in r.stdout and "net_queue probe cost" not in r.stdout, r.stdout
    assert "compiling" not in (r.stdout + r.stderr).lower()
    assert not (tmp_path / "net_queue_cost.json").exists()
    assert not subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count("obnq-")
